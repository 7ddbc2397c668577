"""CPU reference rollout engine: a mirror of vLLM 0.26's FP8 loading semantics (read from its source and
measured on the H200, shared/gpu/README.md):

* built from a quantization config with exact-name `ignored_layers` (`is_layer_skipped`: a fused layer is
  skipped iff its fused name or all its shards are listed; some-but-not-all raises);
* starts from dummy weights (U(-1e-3, 1e-3), FP8 drawn in fp16 and cast), post-processed once;
* installs through the layerwise reload (`model_runner.reload_weights(..., is_checkpoint_format=True)`): per
  module, checkpoint-format buffers are allocated fresh (uninitialised), weight loaders write shards at their
  stacked-parameter offsets (`param.data.copy_`, which casts dtypes silently), the module's post-load step
  runs once its element count is complete, and the result is copied into the original storage (so captured
  CUDA graphs read the new weights). Loads arriving after a module completed are dropped; a module nobody
  wrote keeps its old tensors; a partially written one is post-processed with uninitialised rows (vLLM's come
  from `torch.empty_strided`, whatever the allocator's block held, other bytes after another reload; the
  mirror's hold the poison byte, which S1 names; no check reads their value: S7's re-sync compares the
  parameters a sync writes whole, `LayoutMap.written_by`);
* post-load on Hopper: identity for CUTLASS and DeepGEMM-FP32; with DeepGEMM + `VLLM_USE_DEEP_GEMM_E8M0=1`
  every eligible block-FP8 linear (N % 64 == 0, K % 128 == 0) is dequantized and requantized with UE8M0
  scales (`requant_weight_ue8m0_inplace`); MoE experts only when the MoE backend is DeepGEMM (the default on
  sm90 is Triton, which keeps weights as loaded).

Generation reads the tensors captured at start-up (what a CUDA graph holds), not whatever object is
currently bound to the parameter name. `sample` (the RL loop's rollout, e2e/rl/engines.py) serves as vLLM does,
with activations in the model's BF16 dtype (every GEMM reads and writes BF16, logits included);
`generate_logprobs` keeps the fp32 reference forward the P1 probe bounds were calibrated on.

The mirror is pure: it declares no fault knob. The steps of its load path a broken engine gets wrong are methods
(`_while_loading`, `_shard_offset`, `_post_load_runs`, `_kernel_scales`, `_write_into`, `_after_reload`) holding
vLLM's behaviour; fp8check's own engine (cpu/perturbed.py) overrides them to inject the knobs.
"""
from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import replace

import torch

from ...config import ENGINE_QUANTIZATION, SyncConfig
from ...kinds import Quantization
from ...patterns import matches_any
from ...digest import state_digest
from ...formats.bytes import poison_
from ...layouts.scale_names import canonical_scale
from ...layouts import (Piece, covers_whole, dst_view, engine_module, is_scale_name, rank_name, scale_name, src_view,
                        weight_of_scale)
from ...memo import ContentMemo, IdentityMemo, Memo, nbytes
from ...models import LINEAR
from ...numerics import TRANSFORMS
from ...numerics.forward import Weights, act_quant, prompts_logprobs
from ...numerics.sampling import sample
from ...record import EngineRecord, Generation, UpdateRecord
from ..protocol import EngineError
from .serving import FORWARDS, ServingMirror
from ..versions import served_versions, versions_meta
from ...numerics.settings import config_settings
from ...numerics.online import online_quantize
from ..vllm_numerics import declared_act_quant, declared_post_load

# The engine's start-up state is deterministic in its settings: the fault matrix builds hundreds of engines, so it
# is memoized (copied in, never shared), within a byte budget; a real-shape state larger than it is rebuilt.
INIT_MEMO_BYTES = 1 << 30
_INIT_CACHE = Memo(INIT_MEMO_BYTES)
_DUMMY = Memo(INIT_MEMO_BYTES)
# the declared post-load transform (UE8M0 requantization) by the content of the module's checkpoint bytes
_POST_LOAD = ContentMemo(64 << 20)      # a tiny model's modules; at real shapes a few
# a kernel tensor's state digest by its identity and version counter: a sleep, a wake and the capture digest the
# whole engine, which mostly has not been written since the last time
_DIGESTS = IdentityMemo(0, max_entries=1 << 14)
# the engine states `forward_key` names, each a number: by content (fingerprints, then a byte compare against a
# private copy) and, for the same tensors unwritten since, by identity. A number is never reused: a state dropped
# from the memo and seen again gets a new one, and its forwards are computed again. A state larger than
# STATE_COPY_BYTES is named by its digests instead: its copy would cost as much memory as the engine.
_STATES = ContentMemo(256 << 20)
_STATE_OF = IdentityMemo(0)
_NUMBERS = itertools.count()
STATE_COPY_BYTES = 32 << 20


DUMMY_DRAW = 1 << 22        # dummy values drawn per tensor; a larger tensor repeats them (the values are arbitrary
#                            small numbers: what matters is that they are not the trainer's)


def _dummy(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """vLLM `initialize_dummy_weights` for one tensor, flat: reseeded, U(-1e-3, 1e-3), FP8 drawn in fp16."""
    def make():
        g = torch.Generator().manual_seed(seed)            # reseeded per tensor: depends on size and dtype only
        dt = torch.float16 if torch.finfo(dtype).bits < 16 else dtype
        return torch.empty(min(numel, DUMMY_DRAW), dtype=dt).uniform_(-1e-3, 1e-3, generator=g).to(dtype)
    return _DUMMY.get((min(numel, DUMMY_DRAW), dtype, seed), make)


def _fill_dummy(t: torch.Tensor, seed: int):
    flat, base = t.view(-1), _dummy(t.numel(), t.dtype, seed)
    for a in range(0, flat.numel(), base.numel()):
        n = min(base.numel(), flat.numel() - a)
        flat[a:a + n].copy_(base[:n])


class _LayerwiseReload:
    """One layerwise reload (vllm/model_executor/model_loader/reload/layerwise.py), fed in one or many buckets:
    each module's checkpoint-format tensors are staged until every element arrived, then processed and copied
    into the parameter's storage; `finish` processes the partial modules anyway (vLLM's finalize) and records the
    untouched ones."""

    def __init__(self, eng: "ReferenceRollout", rec: UpdateRecord):
        self.eng, self.rec, tp = eng, rec, eng.tp
        self.modules = [eng._modules(r) for r in range(tp)]
        self.staged: list[dict[str, dict[str, torch.Tensor]]] = [defaultdict(dict) for _ in range(tp)]
        # a module is complete once every checkpoint-format element arrived (online quant: no scales arrive)
        self.totals = [{m: sum(eng.params[r][n].numel() for n in ns if not (eng.online_quant and is_scale_name(n)))
                        for m, ns in self.modules[r].items()} for r in range(tp)]
        self.written = [Counter() for _ in range(tp)]
        self.done = [set() for _ in range(tp)]
        self.new_versions = [defaultdict(set) for _ in range(tp)]
        self.loads = 0

    def load(self, weights):
        eng, rec = self.eng, self.rec
        for item in weights:
            self.loads += 1
            name, tensor = eng._canonical(item[0], item[1])
            ver = item[2] if len(item) > 2 else rec.version
            eng._while_loading(self.loads)
            if name in eng.config.kv_scale_names:
                eng._load_kv_scale(name, tensor)
                continue
            for r in range(eng.tp):
                for p in eng._pieces_for(name, r, rec):
                    p = eng._shard_offset(p, r)
                    mod = eng.param_module(p.dst)
                    if mod in self.done[r]:
                        rec.dropped_loads.append(rank_name(name, r, eng.tp))
                        continue
                    buf = self.staged[r][mod]
                    whole = len(self.modules[r][mod]) == 1 and covers_whole(p, tuple(eng.params[r][p.dst].shape))
                    for n in self.modules[r][mod]:
                        if n not in buf:
                            buf[n] = eng._checkpoint_buffer(n, eng.params[r][n], whole)
                    self.written[r][mod] += eng._copy_piece(p, tensor, buf[p.dst], name, rec)
                    self.new_versions[r][p.dst].add(ver)
                    if self.written[r][mod] >= self.totals[r][mod]:
                        eng._finish(r, mod, self.staged[r].pop(mod), rec)
                        self.done[r].add(mod)

    def finish(self):
        eng, rec = self.eng, self.rec
        for r in range(eng.tp):                          # finalize: partial modules are processed anyway
            for mod in self.modules[r]:
                if mod in self.done[r]:
                    rec.completed.append(rank_name(mod, r, eng.tp))
                elif mod in self.staged[r]:
                    rec.partial.append(rank_name(mod, r, eng.tp))
                    eng._finish(r, mod, self.staged[r].pop(mod), rec)
                else:
                    rec.untouched.append(rank_name(mod, r, eng.tp))
            for n, vs in self.new_versions[r].items():
                eng.versions[r][n] = set(vs)
        rec.completed = sorted(rec.completed)


class ReferenceRollout(ServingMirror):
    engine = "cpu-reference-vllm"
    quantizations = ENGINE_QUANTIZATION     # it serves every rollout.quantization
    knobs = frozenset()                     # the pure mirror: the fault knobs live in cpu/perturbed.py

    def __init__(self, config: SyncConfig, *, ignored_layers=None, seed: int = 1234, shard_rank=None,
                 load_quantizer=None):
        """`ignored_layers`: the engine's own exclusion list (default: the config's). `shard_rank(name, rank)`:
        which rank's shard a checkpoint tensor is narrowed to on `rank` (default: its own; a fault breaks it).
        `load_quantizer`: on an engine that quantizes on load (rollout.quantization=nemo-rl-blockwise), the 2-D
        quantizer its load path runs, called as NeMo RL calls `cast_tensor_to_fp8_blockwise` (default:
        harness.numerics.nemo_rl's re-statement of it)."""
        config.spec.require_modelled()
        self.config = config
        self.layout = config.layout
        self.recipe = config.engine_recipe                  # the grid the engine holds FP8 on
        self.tp = config.rollout.tp_size
        self.ignored_layers = tuple(config.ignored_layers if ignored_layers is None else ignored_layers)
        # BF16 checkpoint, quantized by the engine after loading (an engine quantizing on load holds checkpoint FP8)
        self.online_quant = config.engine_quantizes and not config.engine_quantizes_on_load
        self.load_quantizer = load_quantizer
        self.fp8_modules = self._quantized_modules()
        self._shard_rank = shard_rank or (lambda name, rank: rank)
        self.poisoned = False
        self.params: list[dict[str, torch.Tensor]] = [self._create(r) for r in range(self.tp)]
        self.post_load = declared_post_load(config, [(r, n, tuple(t.shape)) for r, ps in enumerate(self.params)
                                                     for n, t in ps.items() if self.is_fp8_param(n)])
        self._graph = [dict(p) for p in self.params]         # what captured CUDA graphs hold
        self.ptrs_at_start = self._ptrs()
        self.versions: list[dict[str, set]] = [defaultdict(set) for _ in range(self.tp)]
        self.updates: list[UpdateRecord] = []
        self.generations: list[dict] = []
        self._updating = False
        self._open: _LayerwiseReload | None = None      # the update in progress (start_update .. finish_update)
        self._held: dict | None = None                  # the forwards' weights while held (`_weights_held`)
        self._pieces: dict = {}                         # (checkpoint name, source rank) -> its layout pieces
        self._init_state(seed)
        self._init_serving(seed)
        # checkpoint names its load path quantizes (NeMo RL's `_is_fp8_weight`: the tensor's vLLM module is FP8)
        self._load_fp8 = frozenset(p.src for p in self.layout.vllm[0] if self.param_module(p.dst) in self.fp8_modules
                                   and not is_scale_name(p.src)) if config.engine_quantizes_on_load else frozenset()

    # -- construction --------------------------------------------------------------------------------------------
    def _module_members(self) -> dict[str, list[str]]:
        """vLLM module -> HF member modules (from the layout, rank 0)."""
        out: dict[str, list[str]] = defaultdict(list)
        for p in self.layout.vllm[0]:
            mod = engine_module(p.dst)
            out[mod].append(p.src.rsplit(".", 1)[0])
        return out

    def _quantized_modules(self) -> frozenset[str]:
        """The engine's own view of which vLLM modules are FP8 (vLLM `is_layer_skipped`, exact names)."""
        if self.config.rollout.quantization == Quantization.NONE:
            return frozenset()                               # started without quantization: BF16 throughout
        kinds = {t.module: t.kind for t in self.config.spec.tensors()}
        ignored = set(self.ignored_layers)
        if self.config.engine_online:                    # no ignored_layers: what the online method skips
            ignored |= {t.module for t in self.config.spec.tensors()
                        if t.kind == LINEAR and t.name not in self.config.engine_fp8_tensors}
        fp8 = set()
        for mod, members in self._module_members().items():
            members = list(dict.fromkeys(members))
            if any(kinds.get(m) != LINEAR for m in members):
                continue
            if mod.endswith((".w13", ".w2")):                # routed experts: quantized by the FusedMoE method
                fp8.add(mod)
                continue
            if matches_any(members[0], self.config.spec.engine_high_precision):
                continue                                     # built with quant_config=None in vLLM
            listed = [m in ignored for m in members]
            if mod in ignored or all(listed):
                continue
            if any(listed):
                raise EngineError(f"Detected some but not all shards of {mod} are quantized. All shards of fused "
                                  f"layers to have the same precision (ignored_layers lists "
                                  f"{[m for m, x in zip(members, listed) if x]})")
            fp8.add(mod)
        return frozenset(fp8)

    param_module = staticmethod(engine_module)

    def is_fp8_param(self, name: str) -> bool:
        return not is_scale_name(name) and self.param_module(name) in self.fp8_modules

    def _create(self, rank: int) -> dict[str, torch.Tensor]:
        shapes = self.layout.vllm_shapes[rank]
        out = {}
        for n, shp in shapes.items():
            if self.param_module(n) in self.fp8_modules:
                out[n] = torch.empty(shp, dtype=self.recipe.fp8_dtype)
                out[scale_name(n)] = torch.full(self.recipe.scale_grid(shp), torch.finfo(torch.float32).min,
                                                dtype=torch.float32).to(self.recipe.scale_dtype)
            else:
                out[n] = torch.empty(shp, dtype=getattr(torch, self.layout.engine_dtype(n)))
        return out

    def _init_state(self, seed: int):
        """Dummy load + first post-processing (memoized: deterministic in the engine's settings; the tensors are
        copied in, never shared)."""
        key = (self.config.model, self.recipe, self.tp, self.fp8_modules, self.online_quant,
               tuple(self.post_load.params), seed)

        init = _INIT_CACHE.lookup(key)
        if init is not None:
            for params, src in zip(self.params, init):
                for n, t in params.items():
                    t.copy_(src[n])
            return
        self._init_dummy(seed)
        self._post_process_all()
        if _INIT_CACHE.fits(nbytes(self.params)):
            _INIT_CACHE.put(key, [{n: t.clone() for n, t in p.items()} for p in self.params])

    def _init_dummy(self, seed: int):
        """vLLM `initialize_dummy_weights`: per tensor, reseeded U(-1e-3, 1e-3); FP8 via fp16; e8m0 left as is."""
        for params in self.params:
            for n, t in params.items():
                if t.dtype == torch.float8_e8m0fnu:
                    t.view(torch.uint8).fill_(127)
                    continue
                _fill_dummy(t, seed)

    def _ptrs(self) -> dict[str, int]:
        return {rank_name(n, r, self.tp): t.data_ptr() for r, ps in enumerate(self.params) for n, t in ps.items()}

    # -- post-load processing ------------------------------------------------------------------------------------
    def _post_process(self, rank: int, module: str, staged: dict[str, torch.Tensor], record: UpdateRecord | None):
        """One module's `process_weights_after_loading`: checkpoint format -> kernel format (in `staged`)."""
        key = rank_name(module, rank, self.tp)
        for _ in range(self._post_load_runs(record)):
            if record is not None:
                record.post_process[key] = record.post_process.get(key, 0) + 1
            if module not in self.fp8_modules:
                continue
            wname = next(n for n in staged if not is_scale_name(n))
            sname = scale_name(wname)
            if self.online_quant and staged[wname].dtype == torch.bfloat16:
                q, s = online_quantize(staged[wname], self.recipe)
                staged[wname], staged[sname] = q, s.to(self.recipe.scale_dtype)
                continue
            if rank_name(wname, rank, self.tp) in self.post_load.params:
                kind, block, w, sc = self.post_load.kind, tuple(self.post_load.block_shape), staged[wname], staged[sname]
                # a pure function of the module's checkpoint bytes, which most syncs repeat: computed once per content
                staged[wname], staged[sname] = TRANSFORMS[kind](w, sc, block) if kind == "identity" else \
                    _POST_LOAD.get_for((kind, block), (w, sc), lambda: TRANSFORMS[kind](w, sc, block))
            staged[sname] = self._kernel_scales(staged[sname], record)

    def _post_process_all(self):
        for r, params in enumerate(self.params):
            for mod, names in self._modules(r).items():
                if mod not in self.fp8_modules:
                    continue                 # post-load of a high-precision module leaves it as it is
                staged = {n: params[n].clone() for n in names}
                self._post_process(r, mod, staged, None)
                for n in names:
                    params[n].copy_(staged[n])

    def _modules(self, rank: int) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for n in self.params[rank]:
            out[self.param_module(n)].append(n)
        return out

    # -- loading -------------------------------------------------------------------------------------------------
    def _canonical(self, name: str, tensor):
        """A checkpoint tensor under the name (and dtype) this engine holds it: vLLM 0.26 loads MXFP8 scales as
        `weight_scale` uint8 (compressed-tensors), which the mirror holds as `weight_scale_inv` E8M0, the same
        bytes (`harness.layouts.scale_names`); every other name as it is."""
        named = canonical_scale(name, tensor, self.recipe.granularity)
        return named if named is not None else (name, tensor)

    def _pieces_for(self, name: str, rank: int, rec: UpdateRecord) -> tuple[Piece, ...]:
        """Where a checkpoint tensor goes on one rank; an unknown name is refused, as vLLM's loader does."""
        src_rank = self._shard_rank(name, rank)
        pieces = self._pieces.get((name, src_rank))
        if pieces is None:                  # a scan of the layout per tensor: once per engine, not per install
            pieces = self._pieces[(name, src_rank)] = tuple(self._layout_pieces(name, src_rank))
        if not pieces or any(p.dst not in self.params[rank] for p in pieces):
            rec.errors.append(f"There is no module or parameter named '{name}' in the model")
            raise EngineError(rec.errors[-1])
        return pieces

    def _layout_pieces(self, name: str, src_rank: int) -> list[Piece]:
        if is_scale_name(name) and self.layout.per_tensor_engine:
            return [p for p in self.layout.vllm_load_pieces(src_rank) if p.src == name]
        if is_scale_name(name):
            w = weight_of_scale(name)
            bn, bk = self.recipe.block_shape
            return [p.scaled(bn, bk, name, scale_name(p.dst)) for p in self.layout.vllm[src_rank] if p.src == w]
        return [p for p in self.layout.vllm[src_rank] if p.src == name]

    def _checkpoint_buffer(self, name: str, like: torch.Tensor, whole: bool = False) -> torch.Tensor:
        """A fresh checkpoint-format buffer (uninitialised: poison bytes). Online quant loads BF16 weights.
        `whole`: the load that creates it writes every byte before anything can read it (the module's only
        parameter, one piece covering it), so the poison fill is skipped (a 1.2 GB embedding per install)."""
        dtype = torch.bfloat16 if (self.online_quant and self.is_fp8_param(name)) else like.dtype
        buf = torch.empty(like.shape, dtype=dtype)
        return buf if whole else poison_(buf)

    def _refuse_knobs(self, knobs: dict | None):
        """Raises EngineError for a knob this engine does not declare (the mirror declares none)."""
        unknown = set(knobs or {}) - self.knobs
        if unknown:
            raise EngineError(f"{self.engine} cannot inject {sorted(unknown)} (supports {sorted(self.knobs)})")

    def install(self, items, version: int | None = None, *, direct: bool = False, knobs: dict | None = None):
        """vLLM's layerwise reload. `items`: iterable of (name, tensor[, version]). direct=True (or
        rollout.install=load_weights): the model's own load_weights instead, as some RL stacks call it. `knobs`:
        refused unless this engine declares them (`knobs`; the mirror declares none)."""
        items = self._on_load(items)
        self._refuse_knobs(knobs)
        rec = self.start_update(version)
        try:
            if direct or self.config.rollout.install == "load_weights":
                self._load_direct(items, rec)
            else:
                self._open.load(items)
                self._open.finish()
            self._after_reload()
        finally:
            self._updating, self._open = False, None
        return rec

    # -- a bucketed update, as vLLM 0.26's weight transfer receives one: start_weight_update, one update_weights
    # per bucket, finish_weight_update (vllm/distributed/weight_transfer/ipc_engine.py: one layerwise reload
    # spans every bucket; a layer is processed when its last element arrives, and what never completes, at finish)
    def start_update(self, version: int | None = None) -> UpdateRecord:
        self.sleepwake.refuse_if_asleep("install")
        rec = UpdateRecord(version)
        self.updates.append(rec)
        self.generations = []                # the record reports generations since this update began
        self._updating = True
        self._open = _LayerwiseReload(self, rec)
        return rec

    def load_bucket(self, items):
        if self._open is None:
            raise EngineError("load_bucket outside an update (call start_update first)")
        self._open.load(self._on_load(items))

    def _on_load(self, items):
        """What the engine's load path makes of the items it is handed: as they are, or, on an engine that
        quantizes on load, NeMo RL's `load_weights` (each FP8 weight quantized, followed by its `_scale_inv`)."""
        if not self.config.engine_quantizes_on_load:
            return items
        from ...numerics.nemo_rl import load_weights
        return load_weights(items, self._load_fp8, self.recipe, self.load_quantizer)

    def finish_update(self) -> UpdateRecord:
        if self._open is None:
            raise EngineError("finish_update outside an update (call start_update first)")
        try:
            self._open.finish()
            self._after_reload()
            return self._open.rec
        finally:
            self._updating, self._open = False, None

    def _load_direct(self, weights, rec: UpdateRecord):
        """vLLM 0.26 `model.load_weights` after startup (measured on the H200): process_weights_after_loading
        re-registered every FP8 linear's parameters as plain `Parameter`s without their weight loaders, so the
        load stops with AttributeError at the first tensor bound for one; what came before it is written
        as-is, with no post-load, and the rest keeps its old bytes."""
        for item in weights:
            name, tensor = self._canonical(item[0], item[1])
            if name in self.config.kv_scale_names:
                self._load_kv_scale(name, tensor)
                continue
            for r in range(self.tp):
                pieces = self._pieces_for(name, r, rec)
                if any(self.param_module(p.dst) in self.fp8_modules for p in pieces):
                    rec.errors.append(f"{name}: 'Parameter' object has no weight loader (vLLM 0.26 post-load "
                                      f"re-registered it; model.load_weights works once: use reload_weights)")
                    raise EngineError(rec.errors[-1])
                for p in pieces:
                    self._copy_piece(p, tensor, self.params[r][p.dst], name, rec)
                    self.versions[r][p.dst] = {item[2] if len(item) > 2 else rec.version}

    @staticmethod
    def _copy_piece(p: Piece, tensor: torch.Tensor, dst: torch.Tensor, name: str, rec: UpdateRecord) -> int:
        """param.data.copy_ of one layout piece (casts dtypes silently, like vLLM); returns elements written."""
        view, src = dst_view(dst, p), src_view(tensor, p)
        if tuple(view.shape) != tuple(src.shape):
            rec.errors.append(f"{name}: loaded shape {tuple(src.shape)} does not match parameter "
                              f"{p.dst} slice {tuple(view.shape)}")
            raise EngineError(rec.errors[-1])
        view.copy_(src)
        return src.numel()

    def _finish(self, rank: int, mod: str, staged: dict[str, torch.Tensor], rec: UpdateRecord):
        self._post_process(rank, mod, staged, rec)
        for n, t in staged.items():
            self._write_into(rank, n, t)

    # -- the load path's steps a perturbed engine overrides (cpu/perturbed.py); here, what vLLM does ---------------
    def _while_loading(self, loads: int):
        """Called before the reload's `loads`-th tensor is written: the scheduler is paused, nothing is served."""

    def _shard_offset(self, piece: Piece, rank: int) -> Piece:
        """Where a shard lands in its parameter: the weight loader's stacked offset, as the layout states it."""
        return piece

    def _post_load_runs(self, record: UpdateRecord | None) -> int:
        """How often a module's `process_weights_after_loading` runs per reload: once."""
        return 1

    def _kernel_scales(self, scales: torch.Tensor, record: UpdateRecord | None) -> torch.Tensor:
        """A post-processed module's scale grid as the kernel reads it: as post-load left it."""
        return scales

    def _write_into(self, rank: int, name: str, t: torch.Tensor):
        """A processed tensor copied into the parameter's original storage (what captured CUDA graphs read)."""
        self.params[rank][name].copy_(t)

    def poison(self):
        """Test mode before a sync: every destination byte set to the sentinel (S1 proves none survives)."""
        for params in self.params:
            for t in params.values():
                poison_(t)
        self.poisoned = True

    # -- vLLM 0.32+'s weight checker, mirrored (harness.engines.vllm_checksum: vLLM's algorithm, not vLLM) --------------
    def weight_checksums(self) -> dict[str, str]:
        """What vLLM's `compute_weight_checksums` reports for an engine holding these parameters (the current ones,
        as `named_parameters()` reads them; every worker's dict merged)."""
        from ..vllm_checksum import weight_checksums
        return {k: v for r, ps in enumerate(self.params) for k, v in weight_checksums(ps, tp=r).items()}

    def reset_weights(self):
        """vLLM's `reset_weights` (`POST /weight_checker {"action": "reset"}`): every parameter zeroed in place."""
        for params in self.params:
            for t in params.values():
                t.zero_()

    def quantize_online(self, items):
        """Naive sync: BF16 weights quantized by the engine's own formula (verl's and SkyRL's sender use it)."""
        out = []
        for n, t, v in items:
            if n in self.config.fp8_tensors:
                q, s = online_quantize(t, self.recipe)
                out += [(n, q, v), (scale_name(n), s, v)]
            else:
                out.append((n, t, v))
        return out

    # -- serving ---------------------------------------------------------------------------------------------------
    def hf_weights(self, tensors: list[dict[str, torch.Tensor]] | None = None) -> Weights:
        """The engine's kernel tensors dequantized and mapped back to HF names, for the forward."""
        tensors = tensors or self._graph
        deq = []
        for r, params in enumerate(tensors):
            d = {}
            for n, t in params.items():
                if is_scale_name(n):
                    continue
                # high precision stays as held (the forward casts at use)
                d[n] = self.recipe.dequantize_weight(t, params[scale_name(n)]) if self.is_fp8_param(n) else t
            deq.append(d)
        hf = self.layout.vllm_to_hf(self.layout.ranks_to_params(deq), with_scales=False)
        fp8 = frozenset(p.src for p in self.layout.vllm[0] if self.param_module(p.dst) in self.fp8_modules)
        return Weights(hf, fp8, act_quant(declared_act_quant(self.config), self.recipe), logit_scale=self.logit_scale)

    @contextmanager
    def _weights_held(self):
        """Inside, `_forward_weights` dequantizes once per engine state; after, nothing is kept (at real shapes the
        FP8 weights in fp32 are four times their bytes)."""
        self._held = {}
        try:
            yield
        finally:
            self._held = None

    def _forward_weights(self) -> Weights:
        held = self._held
        if held is None:
            return self.hf_weights()
        key = self.forward_key()
        if held.get("key") != key:
            held.update(key=key, weights=self.hf_weights())
        return held["weights"]

    def forward_key(self, *what) -> tuple:
        """What the reference forward of this engine's kernel tensors depends on, by content: the model, every
        tensor the kernels read (`_state`), which GEMMs run FP8, the activation quantizer, the logit scale.
        The fault matrix builds hundreds of engines that hold a few distinct states; their forwards are shared
        (`FORWARDS`), never their serving state (the prefix cache, versions, generations stay per engine)."""
        return (self.config.model, self.recipe.name, self.tp, self._state(), self.fp8_modules,
                declared_act_quant(self.config), self.logit_scale, *what)

    def _state(self):
        """The kernel tensors' content: its number in `_STATES` (a pass to fingerprint it, one to compare it), or
        for a state larger than STATE_COPY_BYTES, its state digests (~10x the time of a pass on the CPU)."""
        names = tuple(rank_name(n, r, self.tp) for r, ps in enumerate(self._graph) for n in ps)
        tensors = [t for ps in self._graph for t in ps.values()]
        if nbytes(tensors) > STATE_COPY_BYTES:
            return tuple(sorted(self.state_digests().items()))
        return _STATE_OF.get_for(names, tensors, lambda: _STATES.get_for(names, tensors, lambda: next(_NUMBERS)))

    def _serve_generation(self, prompts):
        self._note_generation()
        self.generations.append(Generation(self._updating, served_versions(self.versions)))
        key = self.forward_key("logprobs", tuple(map(tuple, prompts)))
        hit = FORWARDS.lookup(key)
        if hit is None:
            hit = FORWARDS.put(key, prompts_logprobs(self.config.spec, self._forward_weights(), prompts))  # fresh tensors
        return [t.clone() for t in hit]

    serving_dtype = torch.bfloat16        # vLLM runs the model in its torch_dtype

    def sample(self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float = 1.0, seed: int = 0,
               stop_token: int | None = None) -> dict:
        """`n` completions per prompt from the installed kernel tensors (e2e/rl/engines.py `RLRollout.sample`):
        {"tokens", "logprobs": [B, max_tokens], "lengths": [B]}, prompt-major (harness.numerics.sampling)."""
        if self._updating:
            raise EngineError("generation requested while a weight update is in progress")
        self._note_generation()
        self.generations.append(Generation(self._updating, served_versions(self.versions)))
        W = replace(self.hf_weights(), act_dtype=self.serving_dtype)
        return sample(self.config.spec, W, prompts, n, max_tokens, temperature, seed, stop_token).to_dict()

    def generate_logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of the prompts' tokens, as the sampler scores them."""
        if self._updating:
            raise EngineError("generation requested while a weight update is in progress")
        return self._serve_generation(prompts)

    # -- snapshot ---------------------------------------------------------------------------------------------------
    def kernel_tensors(self, names=None) -> dict[str, torch.Tensor]:
        """What the kernels read (the captured storage), under vLLM names (tp-prefixed when sharded)."""
        return {k: t.clone() for k, t in self.kernel_views(names).items()}

    def kernel_views(self, names=None) -> dict[str, torch.Tensor]:
        """`kernel_tensors` without the copy, for a comparison made at once in this process (protocol:
        optional; at real shapes a second copy of the engine state is gigabytes)."""
        want = None if names is None else set(names)
        return {rank_name(n, r, self.tp): t.detach() for r, ps in enumerate(self._graph) for n, t in ps.items()
                if want is None or rank_name(n, r, self.tp) in want}

    def state_digests(self) -> dict[str, str]:
        return {rank_name(n, r, self.tp): _DIGESTS.get_for("state", (t,), lambda t=t: state_digest(t))
                for r, ps in enumerate(self._graph) for n, t in ps.items()}

    def record(self) -> EngineRecord:
        ptrs = self._ptrs()
        return EngineRecord(
            engine=self.engine, tp_size=self.tp, ignored_layers=list(self.ignored_layers),
            fp8_modules=sorted(self.fp8_modules), online_quant=self.online_quant,
            settings=config_settings(self.config),
            param_dtypes={rank_name(n, r, self.tp): str(t.dtype).removeprefix("torch.")
                          for r, ps in enumerate(self.params) for n, t in ps.items()},
            storage_moved=sorted(n for n in ptrs if ptrs[n] != self.ptrs_at_start.get(n)),
            versions=versions_meta(self.versions, self.tp), updates=self.updates[-1:],
            generations=list(self.generations), poisoned=self.poisoned, post_load=self.post_load,
            act_quant=declared_act_quant(self.config), serving=self.serving_state())
