"""fp8check's vLLM worker extension: one engine argument makes any vLLM engine (0.26 to 0.34) checkable.

    llm = vllm.LLM(model=..., quantization="fp8", worker_extension_cls=WORKER_EXTENSION)
    llm.collective_rpc("fp8check_digests")      # one result per tensor-parallel rank

vLLM mixes `worker_extension_cls` into its worker class (vllm/config/parallel.py, `worker_extension_cls`), so
these methods run inside every worker process and `collective_rpc("name", args=...)` reaches them by name, with
or without V1 multiprocessing. Results cross vLLM's RPC as plain data (tensors as dtype + shape + bytes, the same
wire as harness.engines.remote), never as torch storages.

Two extensions. `WORKER_EXTENSION` (`FP8CheckWorkerExtension`), the one a user adds to their own engine, only
reads: digests, parameter info, named tensors, KV scales, storage pointers, and the post-load counters that
`fp8check_instrument` keeps (it wraps each layer's post-load hook with a counter; the wrapped hook runs exactly as
before). Nothing in it writes engine memory (`tests/test_vllm_adapter_standin.py` holds it to that).
`TEST_EXTENSION` (`FP8CheckTestExtension`, a subclass) adds what changes engine state -- the sync itself
(`fp8check_reload`, `fp8check_load_direct`, `fp8check_poison`), KV-scale pinning, the fault knobs -- and only
fp8check's own engines load it.

What the kernels read: with CUDA graphs the captured graphs read the parameter storage that existed when they
were captured, so the extension remembers each parameter's tensor at instrumentation time (`_fp8check_graph`)
and reads those; a parameter rebound to new storage later is reported as moved (S7), and its new values are not
what the graphs serve.

What differs between vLLM releases comes from harness.engines.vllm_api, read in the worker's own process.
"""
from __future__ import annotations

import weakref
from collections import Counter

import torch

WORKER_EXTENSION = "fp8check.harness.engines.vllm_extension.FP8CheckWorkerExtension"
TEST_EXTENSION = "fp8check.harness.engines.vllm_extension.FP8CheckTestExtension"


class _Oriented:
    """A parameter read in checkpoint orientation: `.data` the re-oriented view, everything else the
    parameter's (storage pointer, meta-ness: what the lifecycle checks watch)."""

    def __init__(self, param, view):
        self._param, self.data = param, view
        self.shape, self.dtype = view.shape, view.dtype

    is_meta = property(lambda self: self._param.is_meta)
    device = property(lambda self: self._param.device)

    def data_ptr(self):
        return self._param.data_ptr()


def _encode(obj):
    from .wire import encode
    return encode(obj)


def _decode(obj):
    from .wire import decode
    return decode(obj)


# model -> {scan kind: name -> module} (`_fp8check_modules`); weak: a released engine's model is not kept
_MODULE_SCANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class FP8CheckWorkerExtension:
    """Mixed into vLLM's GPU worker (`self` is the worker: `self.model_runner`, `self.device`)."""

    # -- state kept on the worker --------------------------------------------------------------------------------
    def _fp8check(self) -> dict:
        st = self.__dict__.get("_fp8check_state")
        if st is None:
            st = self.__dict__["_fp8check_state"] = {"calls": Counter(), "runs": Counter(), "repeats": 1,
                                                     "graph": None, "ptrs": None, "layers": None,
                                                     "graph_ptrs": None, "walk": None, "params": None}
        return st

    def _fp8check_model(self):
        return self.model_runner.get_model()

    def _fp8check_tensors(self) -> tuple:
        """(parameters, buffers) by name, what `named_parameters()` and `named_buffers()` give, in one walk over
        the model's module list (kept: the tree is fixed for an engine's life; what each module holds is read
        now, as a reload rebinds parameters). Within one `fp8check_record` the walk is made once: its reads are
        one moment of the engine, and the tree is walked once, not once per read."""
        memo = self._fp8check().get("walk")
        if memo is not None:
            return memo
        params, buffers, seen_p, seen_b = {}, {}, set(), set()
        for prefix, m in self._fp8check_modules("all", lambda model: [(f"{n}." if n else "", m)
                                                                       for n, m in model.named_modules()]):
            for k, p in m._parameters.items():          # as named_parameters: a tied tensor under its first name
                if p is not None and id(p) not in seen_p:
                    seen_p.add(id(p))
                    params[prefix + k] = p
            for k, b in m._buffers.items():
                if b is not None and id(b) not in seen_b:
                    seen_b.add(id(b))
                    buffers[prefix + k] = b
        return params, buffers

    def _fp8check_params(self) -> dict:
        """Parameters under the names and orientation fp8check's snapshots use (checkpoint orientation): vLLM's
        online per-tensor FP8 (`quantization="fp8"` on a BF16 checkpoint, Fp8PerTensorOnline*Method) stores a
        linear's codes transposed (`qweight.t()`, [K, N]) and one `weight_scale` ([1]; experts [E]); they are
        read as the [N, K] codes (the view's transpose: no copy) and `weight_scale_inv` ([1]; experts [E, 1]),
        the same dequantization multiplier under the name every other FP8 weight's scale has."""
        memo = self._fp8check().get("params")
        if memo is not None:
            return memo
        ps = dict(self._fp8check_tensors()[0])
        for mod, m in self._fp8check_layers().items():
            kind = type(getattr(m, "quant_method", None)).__name__
            if "PerTensorOnline" not in kind:
                continue
            pre = f"{mod}." if mod else ""
            for w in ("weight", "w13_weight", "w2_weight"):
                if pre + w in ps and pre + w + "_scale" in ps:
                    p, sc = ps[pre + w], ps.pop(pre + w + "_scale")
                    if "MoE" not in kind and p.dim() == 2 and not p.is_meta:
                        # the CUTLASS kernel pads N and K to multiples of 16 (an 8-expert router is held as 16
                        # rows): the model's rows and columns are the leading ones
                        v = p.data.t()
                        n, k = getattr(m, "output_size_per_partition", None), getattr(m, "input_size_per_partition", None)
                        if isinstance(n, int) and isinstance(k, int) and tuple(v.shape) != (n, k):
                            v = v[:n, :k]
                        ps[pre + w] = _Oriented(p, v)
                    ps[pre + w + "_scale_inv"] = sc if sc.is_meta or sc.dim() != 1 or "MoE" not in kind \
                        else _Oriented(sc, sc.data.reshape(-1, 1))
        return ps

    def _fp8check_modules(self, kind: str, scan) -> dict:
        """`scan(model)` once per model object: the module tree is fixed for an engine's life (a reload rebinds
        parameters, never modules): every record, digest pass and poison reads the kept scan instead of walking
        the tree again."""
        model = self._fp8check_model()
        try:
            cache = _MODULE_SCANS.setdefault(model, {})      # fp8check's memo: the worker gains no attribute
        except TypeError:                                    # a model that takes no weak reference: scan it
            return scan(model)
        if kind not in cache:
            cache[kind] = scan(model)
        return cache[kind]

    def _fp8check_layers(self) -> dict:
        """Layer name -> module, for every module with parameters and a quantization method (the layers whose
        post-load step a reload runs)."""
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        return self._fp8check_modules("layers", lambda model: {
            n: m for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None), QuantizeMethodBase)
            and any(True for _ in m.named_parameters(recurse=False))})

    # -- setup ---------------------------------------------------------------------------------------------------
    def fp8check_instrument(self) -> list:
        """Count, per layer, how often vLLM asks for process_weights_after_loading and how often it runs; remember
        the storage every parameter has now (what captured graphs read). Idempotent."""
        st = self._fp8check()
        for name, layer in self._fp8check_layers().items():
            qm = layer.quant_method
            if "_fp8check_orig" in qm.__dict__:
                continue
            orig = qm.process_weights_after_loading
            qm.__dict__["_fp8check_orig"] = orig

            def wrapped(lyr, _orig=orig, _name=name):
                st["calls"][_name] += 1
                for _ in range(st["repeats"]):
                    st["runs"][_name] += 1
                    _orig(lyr)
            qm.process_weights_after_loading = wrapped
        if st["graph"] is None:
            ps = self._fp8check_params()
            st["graph"] = {n: p.data for n, p in ps.items() if not p.is_meta}
            st["ptrs"] = {n: p.data_ptr() for n, p in ps.items() if not p.is_meta}
            st["graph_ptrs"] = self._fp8check_graph_ptrs()
        st["layers"] = sorted(self._fp8check_layers())
        return st["layers"]

    def _fp8check_attention(self) -> dict:
        """Attention layer name -> module (the layers holding KV-cache scales and a KV cache)."""
        return self._fp8check_modules("attention", lambda model: {
            n: m for n, m in model.named_modules() if hasattr(m, "kv_cache_dtype") and hasattr(m, "_k_scale")})

    def _fp8check_graph_ptrs(self) -> dict:
        """Every tensor a captured CUDA graph reads by pointer: parameters, buffers, KV-cache tensors."""
        params, buffers = self._fp8check_tensors()
        out = {n: p.data_ptr() for n, p in params.items() if not p.is_meta}
        out.update({n: b.data_ptr() for n, b in buffers.items() if not b.is_meta})
        for name, m in self._fp8check_attention().items():
            kv = getattr(m, "kv_cache", None)
            kvs = kv if isinstance(kv, (list, tuple)) else [kv]
            for i, t in enumerate(kvs):
                if isinstance(t, torch.Tensor) and t.numel():
                    out[f"{name}.kv_cache[{i}]"] = t.data_ptr()
        return out

    def fp8check_graph_moved(self) -> tuple:
        """(tensors watched, graph-visible tensors whose storage moved since the graphs were captured)."""
        before = self._fp8check()["graph_ptrs"] or {}
        now = self._fp8check_graph_ptrs()
        return len(before), sorted(n for n, p in before.items() if now.get(n) != p)

    def fp8check_rewatch_graph(self) -> int:
        """Re-read graph pointers (after the engine captured its graphs: instrumentation runs before capture on
        some paths). Idempotent; returns how many tensors are watched."""
        st = self._fp8check()
        st["graph_ptrs"] = self._fp8check_graph_ptrs()
        return len(st["graph_ptrs"])

    def fp8check_counts(self) -> tuple:
        st = self._fp8check()
        return dict(st["calls"]), dict(st["runs"])

    def fp8check_counts_since(self, mark: str = "observe") -> tuple:
        """Post-load calls and runs per layer since `mark` was last read, and the mark moved to now: one observed
        sync's counts on an engine whose syncs someone else performs (only fp8check's own counters are touched,
        never the engine's state)."""
        st = self._fp8check()
        marks = st.setdefault("marks", {})
        calls0, runs0 = marks.get(mark, ({}, {}))
        calls, runs = dict(st["calls"]), dict(st["runs"])
        marks[mark] = (calls, runs)
        return ({k: v - calls0.get(k, 0) for k, v in calls.items() if v - calls0.get(k, 0)},
                {k: v - runs0.get(k, 0) for k, v in runs.items() if v - runs0.get(k, 0)})

    # -- reads (never mutate) -------------------------------------------------------------------------------------
    def _fp8check_kernel_view(self, cuda_graphs: bool) -> dict:
        """Parameter name -> the tensor the kernels read: the captured storage under CUDA graphs, the current
        parameter otherwise (a parameter left on the meta device maps to None)."""
        ps = self._fp8check_params()
        graph = self._fp8check()["graph"] or {}
        out = {}
        for n, p in ps.items():
            if p.is_meta:
                out[n] = None
            elif cuda_graphs and n in graph:
                out[n] = graph[n]
            else:
                out[n] = p.data
        return out

    def _fp8check_device(self):
        # the worker's own device: during a layerwise reload the parameters sit on the meta device
        return getattr(self, "device", None) or next(iter(self._fp8check_params().values())).device

    def fp8check_warm(self) -> list:
        """Compile the digest kernels on this worker's GPU (the first sync's capture is then as fast as a later
        one's); touches no parameter."""
        from ..numerics.warmup import warm_kernels
        return warm_kernels(self._fp8check_device())

    def fp8check_info(self) -> dict:
        from ..sync.payload import dtype_name
        ptrs0 = self._fp8check()["ptrs"] or {}
        out = {}
        for n, p in self._fp8check_params().items():
            meta = p.is_meta
            ptr = None if meta else p.data_ptr()
            out[n] = {"shape": list(p.shape), "dtype": dtype_name(p.dtype), "ptr": ptr, "meta": meta,
                      "moved": ptr is not None and n in ptrs0 and ptr != ptrs0[n]}
        return out

    def fp8check_record(self, serving: bool = True, digests: bool | None = None) -> dict:
        """Everything the engine record reads from a worker, in one RPC (it made four: parameter info, settings,
        the graph-storage watch, KV-cache scales), with the seconds each read took here; `serving=False` (an engine
        asleep) leaves the graph watch and the KV-cache scales out. `digests` (not None: its `cuda_graphs`): the
        parameters' digests too (`fp8check_digests`), their kernels enqueued before the reads, whose host work
        then overlaps them (a digest-first capture's one call)."""
        import time
        st = self._fp8check()
        try:
            t = time.perf_counter()
            st["walk"] = self._fp8check_tensors()      # every read below sees the one walk (and one view)
            st["params"] = self._fp8check_params()
            seconds = {"walk": time.perf_counter() - t}
            t = time.perf_counter()
            finish = self._fp8check_start_digests(digests) if digests is not None else None
            if finish is not None:
                seconds["digests_launch"] = time.perf_counter() - t
            parts = [("info", self.fp8check_info), ("settings", self.fp8check_settings)]
            if serving:
                parts += [("graph", self.fp8check_graph_moved), ("kv_scales", self.fp8check_kv_scales)]
            out = {}
            for key, read in parts:
                t = time.perf_counter()
                out[key] = read()
                seconds[key] = time.perf_counter() - t
            if finish is not None:
                t = time.perf_counter()
                out["digests"] = finish()
                seconds["digests_wait"] = time.perf_counter() - t
        finally:
            st["walk"] = st["params"] = None
        out["seconds"] = seconds
        return out

    def fp8check_settings(self) -> dict:
        """How this engine really runs, read from the engine (never from fp8check's config): the quantization
        method its linear layers run (a block-FP8 checkpoint, vLLM's online per-tensor or per-block FP8, none),
        the weight block size, the KV-cache dtype, and DeepGEMM / E8M0 as this process resolved them."""
        import vllm.envs as envs
        methods = sorted({type(m.quant_method).__name__ for m in self._fp8check_layers().values()})
        qc = getattr(getattr(self.model_runner, "vllm_config", None), "quant_config", None)
        try:
            from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used
            e8m0 = bool(is_deep_gemm_e8m0_used())
        except Exception:  # noqa: BLE001 - an older vLLM: what the environment asks for is all we know
            e8m0 = None
        cache = getattr(self, "cache_config", None) or getattr(self.model_runner, "cache_config", None)
        return {"quant_methods": methods, "quantization": None if qc is None else str(qc.get_name()),
                "weight_block_size": list(getattr(qc, "weight_block_size", None) or []) or None,
                "checkpoint_fp8": getattr(qc, "is_checkpoint_fp8_serialized", None),
                "kv_cache_dtype": None if cache is None else str(cache.cache_dtype),
                "VLLM_USE_DEEP_GEMM": bool(envs.VLLM_USE_DEEP_GEMM),
                "VLLM_USE_DEEP_GEMM_E8M0": bool(envs.VLLM_USE_DEEP_GEMM_E8M0), "ue8m0_in_use": e8m0,
                # VLLM_RELOAD_MODE as this process resolved it (a release without the setting: None)
                "reload_mode": getattr(envs, "VLLM_RELOAD_MODE", None)}

    def fp8check_read(self, names=None, cuda_graphs: bool = False):
        """Named tensors as the kernels read them, copied to the host (encoded for the RPC)."""
        view = self._fp8check_kernel_view(cuda_graphs)
        return _encode({n: t.detach().to("cpu", copy=True) for n, t in view.items()
                        if t is not None and (names is None or n in names)})

    def fp8check_digests(self, cuda_graphs: bool = False) -> dict:
        """Parameter -> streaming state digest, computed on the device (harness.digest)."""
        return self._fp8check_start_digests(cuda_graphs)()

    def _fp8check_start_digests(self, cuda_graphs: bool = False):
        """`fp8check_digests` started: the kernels enqueued, the result when the returned function is called."""
        from ..digest import start_state_digests
        view = self._fp8check_kernel_view(cuda_graphs)         # `.data`: detached already
        ps = self._fp8check_params() if any(t is None for t in view.values()) else {}
        # a parameter left on the meta device is digested as its meta tensor: named by its dtype and shape
        return start_state_digests({n: ps[n].data if t is None else t for n, t in view.items()})

    def fp8check_kv_scales(self) -> dict:
        """Attention layer -> its KV-cache scales as the kernels read them (floats; None where absent)."""
        out, read = {}, []
        for name, m in self._fp8check_attention().items():
            rec = {}
            for key, attr in (("k", "_k_scale"), ("v", "_v_scale"), ("q", "_q_scale"), ("prob", "_prob_scale")):
                t = getattr(m, attr, None)
                if not isinstance(t, torch.Tensor) or not t.numel():
                    rec[key] = None
                elif t.is_meta:        # a layer whose reload never finished holds no scale: NaN, which R1 fails
                    rec[key] = float("nan")
                else:
                    read.append((rec, key, t))
            out[name] = rec
        # one copy to the host for every layer's scales (one float() each would be a device synchronize each), one
        # concatenation per device (not three small ops per scale)
        by_device: dict = {}
        for r in read:
            by_device.setdefault(r[2].device, []).append(r)
        with torch.no_grad():
            for rs in by_device.values():
                flat = torch.cat([t.reshape(-1) if t.numel() == 1 else t.reshape(-1)[:1] for _, _, t in rs])
                for (rec, key, _), v in zip(rs, flat.float().tolist()):
                    rec[key] = v
        return out


class FP8CheckTestExtension(FP8CheckWorkerExtension):
    """fp8check's own engines: the read-only extension plus everything that changes engine state (the sync, KV-scale
    pinning, fault knobs). Never added to a user's engine."""

    def fp8check_reset_counts(self, repeats: int = 1) -> bool:
        st = self._fp8check()
        st["calls"].clear()
        st["runs"].clear()
        st["repeats"] = int(repeats)
        return True

    # -- serving setup (fp8check's own engine: what an RL stack does after boot and every wake) --------------------
    @staticmethod
    def _fp8check_set_kv_scale(m, which: str, value: float):
        """One attention layer's `which` (k | v | q | prob) KV-cache scale and its float / CPU mirrors, in place
        (the storage captured graphs read stays)."""
        for attr in (f"_{which}_scale", f"_{which}_scale_cpu"):
            t = getattr(m, attr, None)
            if isinstance(t, torch.Tensor):
                t.fill_(value)
        if hasattr(m, f"_{which}_scale_float"):
            setattr(m, f"_{which}_scale_float", float(value))

    def fp8check_pin_kv_scales(self, value: float = 1.0) -> int:
        """Set every KV-cache scale (and its float / CPU mirrors) to `value`. vLLM's dummy boot can leave them at a
        tiny random value."""
        n = 0
        with torch.no_grad():
            for m in self._fp8check_attention().values():
                for which in ("k", "v", "q", "prob"):
                    self._fp8check_set_kv_scale(m, which, value)
                n += 1
        return n

    def fp8check_empty_cache(self) -> bool:
        """Before a wake: return cached blocks so the allocator can map the pools back at their addresses."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True

    def fp8check_serving_fault(self, knobs: dict) -> bool:
        """Fault knobs a broken reload turns (harness.engines.protocol.KNOBS), applied after an install."""
        with torch.no_grad():
            if knobs.get("kv_scale_placeholder") is not None:
                first = next(iter(self._fp8check_attention().values()))
                first._k_scale.fill_(float(knobs["kv_scale_placeholder"]))
            for which, v in (knobs.get("wake_kv_scales") or {}).items():     # a wake that resets / zeroes them
                for m in self._fp8check_attention().values():
                    self._fp8check_set_kv_scale(m, which, float(v))
            if "logit_scale" in knobs:       # vLLM's LogitsProcessor.scale multiplies the logits (prompt log-probs too)
                lp = self._fp8check_model().logits_processor
                st = self._fp8check()
                st.setdefault("logit_scale0", lp.scale)
                lp.scale = st["logit_scale0"] if knobs["logit_scale"] is None else float(knobs["logit_scale"])
            if knobs.get("realloc_buffer"):
                model = self._fp8check_model()
                name, buf = next((n, b) for n, b in model.named_buffers() if n.endswith("cos_sin_cache"))
                owner = model.get_submodule(name.rsplit(".", 1)[0])
                owner._buffers[name.rsplit(".", 1)[1]] = buf.clone()
        return True

    # -- the sync (fp8check's own engine only) ----------------------------------------------------------------------
    def fp8check_poison(self) -> bool:
        from ..formats.bytes import poison_
        with torch.no_grad():
            for t in self._fp8check_kernel_view(False).values():
                if t is not None:
                    poison_(t)
        return True

    def fp8check_reload(self, items, detach: bool = False) -> bool:
        """vLLM's layerwise reload of checkpoint-format tensors (items encoded for the RPC). `detach` (a fault
        knob): afterwards every parameter is rebound to a copy of its new values and its original storage gets
        back the bytes it held before the install -- loaded weights in new tensors, graphs reading the old."""
        items = _decode(items)
        dev = next(iter(self._fp8check_params().values())).device
        before = None
        if detach:
            before = {n: p.data.clone() for n, p in self._fp8check_params().items() if not p.is_meta}
        self.model_runner.reload_weights(weights_iterator=((n, t.to(dev)) for n, t in items), is_checkpoint_format=True)
        if detach:
            with torch.no_grad():
                for n, p in self._fp8check_params().items():
                    if n in before and not p.is_meta:
                        new = p.data.clone()
                        p.data.copy_(before[n])
                        p.data = new
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return True

    # vLLM's own bucketed update (distributed/weight_transfer/ipc_engine.py): one reload spans the buckets; in a
    # layerwise reload a layer is processed when its last element arrives, the rest at finish. The begin / end pair
    # is the release's (vllm_api fact `reload_lifecycle`: from 0.34 the pair that honours VLLM_RELOAD_MODE)
    def fp8check_start_update(self) -> bool:
        from .vllm_api import engine_facts
        if engine_facts().reload_lifecycle == "lifecycle":
            from vllm.model_executor.model_loader.reload import start_reload
            start_reload(self._fp8check_model())
        else:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
            initialize_layerwise_reload(self._fp8check_model())
        return True

    def fp8check_load_bucket(self, items) -> bool:
        items = _decode(items)
        dev = self._fp8check_device()
        with torch.no_grad():
            self._fp8check_model().load_weights([(n, t.to(dev)) for n, t in items])
        return True

    def fp8check_finish_update(self) -> bool:
        from .vllm_api import engine_facts
        if engine_facts().reload_lifecycle == "lifecycle":
            from vllm.model_executor.model_loader.reload import finish_reload
            finish_reload(self._fp8check_model(), self.model_runner.model_config, self._fp8check_device())
        else:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
            finalize_layerwise_reload(self._fp8check_model(), self.model_runner.model_config)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return True

    def fp8check_load_direct(self, items) -> list:
        """The direct path (`model.load_weights`), as some RL stacks call it; vLLM refuses it after the first
        post-load for FP8 linears (their parameters lose their weight loaders; VLLM_RELOAD_MODE=direct is a
        reload mode, not this path)."""
        items = _decode(items)
        dev = next(iter(self._fp8check_params().values())).device
        with torch.no_grad():
            return sorted(self._fp8check_model().load_weights(iter([(n, t.to(dev)) for n, t in items])) or [])

    def fp8check_quantize_online(self, items, block) -> object:
        """Naive sync: the engine quantizes BF16 weights with vLLM's own block quantizer."""
        from vllm.utils.deep_gemm import per_block_cast_to_fp8
        from ..layouts import scale_name
        out = []
        for n, t, fp8 in _decode(items):
            if fp8:
                q, s = per_block_cast_to_fp8(t.cuda().float(), block_size=list(block), use_ue8m0=False)
                out += [(n, q.cpu()), (scale_name(n), s.float().cpu())]
            else:
                out.append((n, t))
        return _encode(out)


__all__ = ["FP8CheckTestExtension", "FP8CheckWorkerExtension", "TEST_EXTENSION", "WORKER_EXTENSION"]
