"""vLLM as a rollout engine (the protocol in harness.engines.protocol), serving a model as the config's
`rollout.quantization` says: a block-FP8 checkpoint (`checkpoint`), a BF16 checkpoint it quantizes itself
(`online-per-tensor`: `quantization="fp8"`; `online-per-block`: `"fp8_per_block"`), a block-FP8 checkpoint whose
load path quantizes each BF16 tensor by NeMo RL's rule (`nemo-rl-blockwise`), or BF16 (`none`).

The engine starts from dummy weights with `quantization_config` from the SyncConfig (block shape, exclusion set
as `ignored_layers`; none for the other three) and fp8check's worker extension (harness.engines.vllm_extension:
the same methods a user's own engine gets with one engine argument), and receives syncs through vLLM's own layerwise reload
(`worker.model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`), or through vLLM's own
trainer-side weight transfer (`rollout.install=weight_source`: harness.engines.vllm_transfer). Everything it reports
is read back from the workers: parameter bytes and digests, data pointers, how many times each layer's
`process_weights_after_loading` ran. Reading never changes engine state.

Releases 0.26 to 0.34: the adapter reads `vllm.__version__` when it starts and takes every difference between
releases from harness.engines.vllm_api (`self.facts`); nothing here compares versions.

Environment (read by vLLM when it starts, so the process is started with it: the registry's `env`):
VLLM_USE_DEEP_GEMM, VLLM_USE_DEEP_GEMM_E8M0 from the config.
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from copy import copy

import torch

from ..config import CHECKPOINT_FORMAT_ENGINES, ENGINE_QUANTIZATION, SyncConfig
from ..layouts import engine_module, rank_name, weight_of_scale
from ..models import MULTIMODAL
from ..numerics.settings import read_settings
from ..record import EngineRecord, Generation, KVScale, Outputs, ReloadContract, ServingState, UpdateRecord
from .protocol import EngineError
from .sleepwake import SleepWake, Sleeps
from .vllm_api import UnsupportedVLLM, engine_facts
from .versions import param_versions, served_versions, versions_meta
from .vllm_extension import TEST_EXTENSION
from .vllm_numerics import declared_act_quant, declared_post_load
from .wire import decode, encode
from ..kinds import Quantization

PROMPT_LOGPROBS = 1


CALIBRATED_KV_UNSUPPORTED = ("rollout.kv_scales=calibrated: installing per-layer KV-cache scales through vLLM 0.26's "
                             "layerwise reload is not mirrored by fp8check's vLLM adapter yet (CPU reference only: "
                             "fp8check faults); use rollout.kv_scales=uniform")


class MissingExtension(EngineError):
    """A vLLM engine without fp8check's worker extension (or without the one a method needs)."""


class UnsupportedEngine(EngineError):
    """A vLLM engine whose weights fp8check cannot judge yet (it quantizes BF16 itself, or runs a method the
    settings reader does not know)."""


JUDGED_METHODS = ("fp8-block", "fp8-online-per-block", "fp8-online-per-tensor", "bf16")


def judgeable(settings: dict) -> str | None:
    """None when fp8check can judge an engine with these settings (read_settings vocabulary); else the one-line
    reason and what to do."""
    m = settings.get("method")
    if m in JUDGED_METHODS:
        return None
    return (f"the engine's linear layers run {m!r} (quantization methods {settings.get('quant_methods') or '?'}), "
            f"which fp8check cannot read; it judges engines serving a block-FP8 checkpoint or BF16")


def engine_env(config: SyncConfig) -> dict[str, str]:
    """Environment a vLLM process needs for this config (explicit values: vLLM's defaults are not ours)."""
    env = {"VLLM_USE_DEEP_GEMM": "1" if config.rollout.use_deep_gemm else "0",
           "VLLM_USE_DEEP_GEMM_E8M0": "1" if config.deep_gemm_e8m0 else "0", "VLLM_DEEP_GEMM_WARMUP": "skip",
           "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "NCCL_NVLS_ENABLE": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if config.rollout.moe_backend == "triton":
        env["VLLM_MOE_USE_DEEP_GEMM"] = "0"   # the selector only checks whether DeepGEMM MoE is requested
    return env


# vllm.LLM(quantization=...) of an engine that quantizes BF16 itself (a BF16 checkpoint): "fp8" on a BF16
# checkpoint is vLLM's online per-tensor method (Fp8Config(is_checkpoint_fp8_serialized=False) ->
# Fp8PerTensorOnlineLinearMethod, quantization/fp8.py:178-192); "fp8_per_block" its online 128x128 one
VLLM_ONLINE_QUANTIZATION = {"online-per-tensor": "fp8", "online-per-block": "fp8_per_block"}


def write_model_dir(config: SyncConfig, path: str, ignored_layers=None) -> str:
    """A checkpoint directory vLLM can start from with load_format=dummy: just config.json (a block-FP8
    checkpoint's `quantization_config`; none for an engine that quantizes BF16 itself or serves it: start that
    one with `quantization=VLLM_ONLINE_QUANTIZATION[config.rollout.quantization]`). A multimodal wrapper's
    (Qwen3.5) is the nested form its registered class reads (`ModelSpec.hf_config`); start it with
    `text_only_kwargs`."""
    os.makedirs(path, exist_ok=True)
    q = config.vllm_quantization_config() if config.rollout.quantization in CHECKPOINT_FORMAT_ENGINES else None
    if ignored_layers is not None and q is not None:
        q["ignored_layers"] = list(ignored_layers)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.spec.hf_config(q), f, indent=1)
    return path


def release_refuses(config: SyncConfig, facts) -> str | None:
    """Why this vLLM release cannot run `config` as fp8check judges it (None: it can)."""
    if config.rollout.quantization == Quantization.ONLINE_PER_TENSOR and config.rollout.tp_size > 1 \
            and facts.online_per_tensor_scale == "tp-group":
        return (f"rollout.quantization=online-per-tensor with tp_size {config.rollout.tp_size}: vLLM "
                f"{facts.version} takes one scale over the tensor-parallel group, fp8check's mirror one per rank; "
                f"use tp_size 1 or rollout.quantization=online-per-block")
    if config.rollout.install == "weight_source" and facts.trainer_transfer is None:
        return (f"rollout.install=weight_source: vLLM {facts.version} has no trainer-side weight transfer engine "
                f"(0.27+); use rollout.install=reload")
    return None


def reload_contract(facts, env_mode: str | None) -> ReloadContract:
    """The engine's declared reload (EngineRecord.reload, read by S7) from its release and its VLLM_RELOAD_MODE."""
    if facts.direct_reload(env_mode):
        return ReloadContract("direct", reprocesses_undelivered=True, rollback=False,
                              source=f"vLLM {facts.version}, VLLM_RELOAD_MODE=direct")
    return ReloadContract("layerwise", source=f"vLLM {facts.version}")


def text_only_kwargs(config: SyncConfig) -> dict:
    """vllm.LLM arguments that start a multimodal wrapper (Qwen3.5: `models.MULTIMODAL`) as its language model: with
    every modality's limit 0 vLLM runs text-only (multimodal/registry.py:103-139, no processor, no multimodal
    profiling) and builds the vision tower on the meta device, registered nowhere (models/interfaces.py:257-296):
    the engine's parameters are the language model's."""
    return {"limit_mm_per_prompt": {"image": 0, "video": 0}} if config.spec.architecture in MULTIMODAL else {}


def serving_kwargs(config: SyncConfig) -> dict:
    """vllm.LLM arguments for how the config says the engine serves. CUDA graphs without torch.compile
    (`mode` 0 keeps eager's kernels; vLLM silently drops PIECEWISE graphs then, so FULL graphs are asked for),
    a few capture sizes to keep start-up short: decode batches of up to 8 sequences replay graphs."""
    r = config.rollout
    kw = {"enforce_eager": not r.cuda_graphs, "kv_cache_dtype": r.kv_cache_dtype,
          "enable_prefix_caching": r.prefix_caching}
    if r.cuda_graphs:
        kw["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4, 8]}
    if r.sleep_mode:
        kw["enable_sleep_mode"] = True
    return kw


def _kv(d: dict) -> dict:
    return {layer: KVScale(v.get("k"), v.get("v"), v.get("q"), v.get("prob")) for layer, v in d.items()}


class VLLMEngine(Sleeps):
    """One vLLM engine in this process (the remote wrapper runs it inside a Ray actor)."""
    engine = "vllm"                          # an instance's: vllm-<release> (harness.engines.vllm_api)
    quantizations = ENGINE_QUANTIZATION     # it serves every rollout.quantization
    knobs = frozenset(("post_process_repeats", "detach_on_install", "kv_scale_placeholder", "realloc_buffer",
                       "keep_prefix_cache", "logit_scale"))

    def __init__(self, config: SyncConfig, workdir: str | None = None, gpu_memory_utilization: float = 0.12,
                 seed: int = 0, ignored_layers=None, llm=None, observe_only: bool = False, facts=None,
                 **llm_kwargs):
        """`llm`: an engine someone else built (it must carry fp8check's worker extension); otherwise one is
        started for `config`. `observe_only`: read, never set anything (a user's engine: no KV-scale pinning,
        versions not claimed). `facts`: the release's facts (default: read from the installed vLLM).
        `llm_kwargs` go to vllm.LLM (e.g. enforce_eager=False, kv_cache_dtype)."""
        if config.calibrated_kv:
            raise EngineError(CALIBRATED_KV_UNSUPPORTED)
        try:
            self.facts = facts if facts is not None else engine_facts()
        except UnsupportedVLLM as e:
            raise UnsupportedEngine(str(e)) from None
        self.engine = f"vllm-{self.facts.version}"
        refused = release_refuses(config, self.facts)
        if refused:
            raise UnsupportedEngine(refused)
        self.config = config
        self.observe_only = observe_only
        self.tp = config.rollout.tp_size
        self.ignored_layers = list(config.ignored_layers if ignored_layers is None else ignored_layers)
        llm_kwargs = {**serving_kwargs(config), **llm_kwargs}
        self.cuda_graphs = not llm_kwargs.get("enforce_eager", True)
        if llm is None:
            for k, v in engine_env(config).items():
                if k == "VLLM_ENABLE_V1_MULTIPROCESSING":
                    os.environ.setdefault(k, v)      # the extension works either way; in-process is the default
                else:
                    os.environ[k] = v
            from vllm import LLM
            import tempfile
            workdir = workdir or tempfile.mkdtemp(prefix="fp8check-vllm-")
            self.model_dir = write_model_dir(config, os.path.join(workdir, f"{config.model}-model"),
                                             self.ignored_layers)
            kw = dict(model=self.model_dir, load_format="dummy",
                      gpu_memory_utilization=gpu_memory_utilization, max_model_len=256, max_num_seqs=8,
                      max_num_batched_tokens=512, skip_tokenizer_init=True, dtype="bfloat16",
                      attention_backend="TRITON_ATTN", seed=seed, tensor_parallel_size=self.tp,
                      worker_extension_cls=TEST_EXTENSION)    # fp8check's own engine: it syncs
            if config.rollout.quantization in VLLM_ONLINE_QUANTIZATION:   # BF16 checkpoint, vLLM quantizes it
                kw["quantization"] = VLLM_ONLINE_QUANTIZATION[config.rollout.quantization]
            if config.rollout.install == "weight_source":      # vLLM's own transfer receives (CUDA IPC)
                kw["weight_transfer_config"] = {"backend": "ipc"}
            kw.update(text_only_kwargs(config))
            kw.update(llm_kwargs)
            llm = LLM(**kw)
        self.llm = llm
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        self.layers = self.rpc("fp8check_instrument")[0]
        self._members = {}                  # layer -> its parameters (the layout's), for a whole-model reload
        for n in config.layout.vllm_param_shapes(0):
            self._members.setdefault(engine_module(n), []).append(n)
        self._reload = reload_contract(self.facts, self.rpc("fp8check_settings")[0].get("reload_mode"))
        self.rpc("fp8check_warm")                  # the digest kernels compiled now, not in the first sync
        self.versions: list[dict] = [defaultdict(set) for _ in range(self.tp)]
        self.updates: list[UpdateRecord] = []
        self.generations: list[Generation] = []
        self.poisoned = False
        self.boot_kv_scales = _kv(self.rpc("fp8check_kv_scales")[0])     # what vLLM left at boot
        if config.rollout.pin_kv_scales and not observe_only:    # (calibrated scales are refused above)
            self.rpc("fp8check_pin_kv_scales", float(config.rollout.kv_scale))
        self.sleepwake, self.outputs = SleepWake(), None
        self._logit_scaled = False
        self._observed = None            # observe mode: the counts of the sync this wrapper was made for
        self._open = None                # a bucketed update in progress: (record, items loaded so far)

    def rpc(self, method: str, *args):
        try:
            return self.llm.collective_rpc(method, args=args)
        except AttributeError as e:                 # the worker has no such method: the extension is missing
            if method not in str(e):
                raise
            from .vllm_extension import FP8CheckTestExtension
            need = "harness.engines.vllm_extension.TEST_EXTENSION (fp8check's own engines)" \
                if hasattr(FP8CheckTestExtension, method) and not self.observe_only else "fp8check.WORKER_EXTENSION"
            raise MissingExtension(f"the vLLM engine's workers have no {method}: start vllm.LLM(..., "
                                   f"worker_extension_cls={need})") from None

    def close(self):
        """Release the engine's GPU memory (the remote wrapper also kills the process)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort; the process exit frees the rest
                pass
            del llm
        import gc
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- sync ----------------------------------------------------------------------------------------------------
    def poison(self):
        self.rpc("fp8check_poison")
        self.poisoned = True

    def install(self, items, version: int | None = None, *, direct: bool = False, knobs: dict | None = None):
        """items: (name, host tensor, version). Returns the update record; EngineError if vLLM refused."""
        items = self._on_load(items)
        knobs = dict(knobs or {})
        unknown = set(knobs) - self.knobs
        if unknown:
            raise EngineError(f"{self.engine} cannot inject {sorted(unknown)}")
        rec = self._begin_update(version, int(knobs.get("post_process_repeats", 1)))
        wire = self._wire(items)
        try:
            if direct or self.config.rollout.install == "load_weights":
                self.rpc("fp8check_load_direct", wire)
            elif self.config.rollout.install == "weight_source":
                self._send_weights(items)
            else:
                self.rpc("fp8check_reload", wire, bool(knobs.get("detach_on_install", False)))
        except Exception as e:  # noqa: BLE001 - the engine refused; record it like the reference does
            rec.errors.append(f"{e.__class__.__name__}: {e}")
            raise EngineError(rec.errors[-1]) from None
        finally:
            self._close_update(rec, items)
        self._after_update(knobs)
        return rec

    def _on_load(self, items) -> list:
        """The items as the engine's load path makes them: as they are, or on an engine that quantizes on load
        (rollout.quantization=nemo-rl-blockwise) NeMo RL's `load_weights` -- here, in the caller's process, before
        the items cross to the workers; the workers then load a block-FP8 checkpoint as NeMo's patched load does."""
        if not self.config.engine_quantizes_on_load:
            return list(items)
        from ..numerics.nemo_rl import load_weights
        fp8 = self.config.engine_fp8_tensors
        return list(load_weights(items, fp8, self.config.engine_recipe))

    def _send_weights(self, items):
        """vLLM's trainer-side transfer (harness.engines.vllm_transfer) of `items`; what its client log shows went
        wrong (a round out of order, a tensor not carried) is the engine refusing the update."""
        from .vllm_transfer import ObservedClient, send_weights
        client = ObservedClient(self.rpc)
        try:
            send_weights(self.facts, client, [(n, t) for n, t, _ in items],
                         "cuda" if torch.cuda.is_available() else None)
            raised = []
        except Exception as e:  # noqa: BLE001 - the engine refused; said after what the log shows the sender did
            raised = [f"{e.__class__.__name__}: {e}"]
        problems = client.problems([n for n, _, _ in items]) + raised
        if problems:
            raise EngineError("; ".join(problems))

    def _begin_update(self, version: int | None, repeats: int = 1) -> UpdateRecord:
        """One update begins: refused while asleep, the post-load counters reset, a fresh record."""
        self.sleepwake.refuse_if_asleep("install")
        self.rpc("fp8check_reset_counts", repeats)
        rec = UpdateRecord(version)
        self.updates.append(rec)
        self.generations = []                # the record reports generations since this update began
        return rec

    def _wire(self, items):
        # in process (V1 multiprocessing off) tensors reach the worker as they are: a trainer's CUDA tensors (CUDA
        # IPC views on the device path) are read device to device; otherwise they cross vLLM's RPC as bytes
        return [(n, t) for n, t, _ in items] if self.in_process else encode([(n, t) for n, t, _ in items])

    def _close_update(self, rec: UpdateRecord, items):
        """The update's record from the workers' post-load counters, then the counters reset for the next. Under a
        reload that post-processes every module (`reprocesses_undelivered`), a module counts as completed when the
        update delivered all its parameters, partial when some, untouched when none (what the counters cannot
        tell: every module's post-load runs)."""
        written = param_versions(self.config, items)
        whole = self._reload is not None and self._reload.reprocesses_undelivered
        for r, (calls, runs) in enumerate(self.rpc("fp8check_counts")):
            for layer in self.layers:
                key = rank_name(layer, r, self.tp)
                rec.post_process[key] = runs.get(layer, 0)
                if whole:
                    members = self._members.get(layer, ())
                    got = sum(1 for n in members if n in written[r])
                    (rec.completed if got == len(members) else rec.partial if got else rec.untouched).append(key)
                else:
                    (rec.completed if calls.get(layer) else rec.untouched).append(key)
        self.rpc("fp8check_reset_counts", 1)
        for r, vs in enumerate(written):
            for n, v in vs.items():
                self.versions[r][n] = v

    def _after_update(self, knobs: dict):
        if not knobs.get("keep_prefix_cache"):
            self.llm.reset_prefix_cache()        # a weight sync does not reset it (0.26 to 0.34)
        if knobs.get("kv_scale_placeholder") is not None or knobs.get("realloc_buffer"):
            self.rpc("fp8check_serving_fault", knobs)
        if knobs.get("logit_scale") is not None or self._logit_scaled:     # set for this install, reset after
            self.rpc("fp8check_serving_fault", {"logit_scale": knobs.get("logit_scale")})
            self._logit_scaled = knobs.get("logit_scale") is not None
        self.sleepwake.synced()

    # -- a bucketed update, as vLLM 0.26's weight transfer receives one (start_weight_update, update_weights per
    # bucket, finish_weight_update: one layerwise reload across the buckets)
    def start_update(self, version: int | None = None) -> UpdateRecord:
        rec = self._begin_update(version)
        self._open = (rec, [])
        self.rpc("fp8check_start_update")
        return rec

    def load_bucket(self, items):
        if self._open is None:
            raise EngineError("load_bucket outside an update (call start_update first)")
        items = self._on_load(items)
        rec, loaded = self._open
        try:
            self.rpc("fp8check_load_bucket", self._wire(items))
        except Exception as e:  # noqa: BLE001 - the engine refused the bucket
            rec.errors.append(f"{e.__class__.__name__}: {e}")
            raise EngineError(rec.errors[-1]) from None
        loaded.extend(items)

    def finish_update(self) -> UpdateRecord:
        if self._open is None:
            raise EngineError("finish_update outside an update (call start_update first)")
        (rec, items), self._open = self._open, None
        try:
            self.rpc("fp8check_finish_update")
        except Exception as e:  # noqa: BLE001
            rec.errors.append(f"{e.__class__.__name__}: {e}")
            raise EngineError(rec.errors[-1]) from None
        finally:
            self._close_update(rec, items)
        self._after_update({})
        return rec

    def quantize_online(self, items):
        """Naive path: BF16 weights quantized inside the engine with vLLM's per_block_cast_to_fp8."""
        fp8 = self.config.fp8_tensors
        out = decode(self.rpc("fp8check_quantize_online", encode([(n, t, n in fp8) for n, t, _ in items]),
                              list(self.config.recipe.block_shape))[0])
        ver = {n: v for n, _, v in items}
        return [(n, t, ver.get(n, ver.get(weight_of_scale(n)))) for n, t in out]

    # -- reading (never mutates) -----------------------------------------------------------------------------------
    def kernel_tensors(self, names=None) -> dict:
        local = None if names is None else sorted({n.split(":", 1)[1] if n.startswith("tp") and ":" in n else n
                                                   for n in names})
        out = {}
        for r, enc in enumerate(self.rpc("fp8check_read", local, self.cuda_graphs)):
            for n, t in decode(enc).items():
                k = rank_name(n, r, self.tp)
                if names is None or k in names:
                    out[k] = t
        return out

    def state_digests(self) -> dict:
        return {rank_name(n, r, self.tp): d for r, ds in enumerate(self.rpc("fp8check_digests", self.cuda_graphs))
                for n, d in ds.items()}

    def _observed_update(self) -> list[UpdateRecord]:
        """A user's engine: the post-load counts since `watch` or the last check (each check reads one observed
        sync's counts: the counters are never reset, their last-read values are) as one update, when any layer
        was processed; nothing claimed otherwise."""
        if self._observed is not None:                    # one reading per record of this wrapper
            return self._observed
        rec = UpdateRecord(None)
        any_call = False
        for r, (calls, runs) in enumerate(self.rpc("fp8check_counts_since", "observe")):
            for layer in self.layers:
                key = rank_name(layer, r, self.tp)
                rec.post_process[key] = runs.get(layer, 0)
                (rec.completed if calls.get(layer) else rec.untouched).append(key)
                any_call = any_call or bool(calls.get(layer))
        self._observed = [rec] if any_call else []
        return self._observed

    def record(self) -> EngineRecord:
        t0 = time.perf_counter()
        state = self.rpc("fp8check_record", not self.sleep_level)       # one RPC for every read below
        return self._record(state, t0, time.perf_counter())

    def record_and_digests(self) -> tuple[EngineRecord, dict]:
        """The record and `state_digests()` from one RPC: the workers enqueue the digest kernels before the
        record's reads, whose host work overlaps them (a digest-first capture's one call to this engine)."""
        t0 = time.perf_counter()
        state = self.rpc("fp8check_record", not self.sleep_level, self.cuda_graphs)
        t1 = time.perf_counter()
        digests = {rank_name(n, r, self.tp): d for r, st in enumerate(state) for n, d in st.pop("digests").items()}
        return self._record(state, t0, t1), digests

    def _record(self, state: list, t0: float, t1: float) -> EngineRecord:
        info = [s["info"] for s in state]
        fp8 = [(r, n, tuple(i["shape"])) for r, inf in enumerate(info) for n, i in inf.items()
               if i["dtype"] == "float8_e4m3fn"]
        # how the engine really runs (read from the workers): its post-load transform and activation quantizer
        # follow from that, not from the config, so a setting the config does not expect is C10's, by name
        settings = read_settings(state[0]["settings"])
        ue8m0 = settings["ue8m0_requant"]
        rec = EngineRecord(
            engine=self.engine, tp_size=self.tp, ignored_layers=list(self.ignored_layers),
            fp8_modules=sorted({engine_module(n) for r, n, _shape in fp8 if r == 0}), poisoned=self.poisoned,
            settings=settings,
            param_dtypes={rank_name(n, r, self.tp): i["dtype"] for r, inf in enumerate(info) for n, i in inf.items()},
            storage_moved=sorted(rank_name(n, r, self.tp) for r, inf in enumerate(info) for n, i in inf.items()
                                 if i["moved"]),
            unmaterialized=sorted(rank_name(n, r, self.tp) for r, inf in enumerate(info) for n, i in inf.items()
                                  if i["meta"]),
            versions=None if self.observe_only else versions_meta(self.versions, self.tp),
            updates=self._observed_update() if self.observe_only else self.updates[-1:],
            generations=list(self.generations), post_load=declared_post_load(self.config, fp8, ue8m0),
            act_quant=declared_act_quant(self.config, ue8m0), serving=self.serving_state(state[0]),
            reload=copy(self._reload), observed=self.observe_only)
        # where the record's time went in this process (the worker's reads, rank 0; the RPC; building it)
        rec.seconds = {**{f"worker.{k}": v for k, v in state[0]["seconds"].items()}, "rpc": t1 - t0,
                       "build": time.perf_counter() - t1}
        return rec

    def serving_state(self, state: dict) -> ServingState:
        """`state`: rank 0's `fp8check_record` (the record's one RPC; no graph watch or KV scales while asleep)."""
        if self.sleep_level:
            watched, moved, kv = None, None, None
        else:
            (watched, moved), kv = state["graph"], _kv(state["kv_scales"])
        return ServingState(cuda_graphs=self.cuda_graphs, kv_cache_dtype=self.config.rollout.kv_cache_dtype,
                            kv_scales=kv, boot_kv_scales=self.boot_kv_scales, graph_storage=watched,
                            graph_storage_moved=moved, sleep_level=self.sleep_level, wake=copy(self.wake_event),
                            outputs=self.outputs)

    # -- vLLM's own weight checker (0.32+): the second oracle (e2e.oracles) ------------------------------------------
    def weight_checksums(self) -> dict[str, str]:
        """vLLM's `compute_weight_checksums` on every worker, merged: one SHA-256 per parameter (no buffer)."""
        self._need_checker()
        out: dict[str, str] = {}
        for d in self.rpc("compute_weight_checksums"):
            out.update(d)
        return out

    def reset_weights(self):
        """vLLM's `reset_weights`: every parameter zeroed (the weight checker's reset; fp8check's own engine only)."""
        self._need_checker()
        if self.observe_only:
            raise EngineError("reset_weights zeroes the engine's weights: not on an engine fp8check only observes")
        self.rpc("reset_weights")

    def _need_checker(self):
        if not self.facts.weight_checksums:
            raise EngineError(f"vLLM {self.facts.version} has no weight checker (compute_weight_checksums: 0.32+)")

    # -- sleep / wake (enable_sleep_mode) ------------------------------------------------------------------------
    def sleep(self, level: int = 1):
        self.sleepwake.begin_sleep(level, self.state_digests, lambda: _kv(self.rpc("fp8check_kv_scales")[0]))
        self.llm.sleep(level=level)
        self.sleepwake.slept(level)

    def wake(self, kv_scales: dict | None = None):
        """Wake every pool (weights first is what vLLM needs after level 2), then what an RL stack does after a
        wake: KV scales pinned again (what vLLM resets on a wake: vllm_api fact `wake_resets_kv_scales`). `kv_scales` (a
        wake fault, fp8check's own engine): leave these KV-cache scales in every attention layer first."""
        self.sleepwake.begin_wake()
        self.rpc("fp8check_empty_cache")
        self.llm.wake_up()
        level = self.sleepwake.awake()
        if kv_scales:
            self.rpc("fp8check_serving_fault", {"wake_kv_scales": dict(kv_scales)})
        after = self.state_digests()
        if self.config.rollout.pin_kv_scales and not self.config.calibrated_kv:
            self.rpc("fp8check_pin_kv_scales", float(self.config.rollout.kv_scale))
        self.sleepwake.woke(level, after, _kv(self.rpc("fp8check_kv_scales")[0]))

    def _note_generation(self):
        self.sleepwake.refuse_if_asleep("generation")
        self.sleepwake.note_generation()

    def measure_outputs(self, prompts, max_tokens: int = 8) -> Outputs:
        g = self.greedy(prompts, max_tokens)
        lp = [[float(x) for x in t] for t in self.generate_logprobs(prompts)]
        self.outputs = Outputs(g, lp)
        return self.outputs

    def generate_logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of each prompt's tokens (vLLM prompt_logprobs), as the sampler scores them."""
        from vllm import SamplingParams
        self._note_generation()
        sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=PROMPT_LOGPROBS, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        res = []
        for p, o in zip(prompts, outs):
            lp = [float(o.prompt_logprobs[i][p[i]].logprob) for i in range(1, len(p))]
            res.append(torch.tensor(lp, dtype=torch.float64))
        self.generations.append(Generation(False, served_versions(self.versions)))
        return res

    def sample(self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float = 1.0, seed: int = 0,
               stop_token: int | None = None, pad: int = 0) -> dict:
        """`n` completions per prompt from the policy this engine serves (e2e/rl/engines.py RLRollout.sample),
        prompt-major; the log-prob of each drawn token under the distribution it was drawn from (start the engine
        with logprobs_mode="processed_logprobs" when temperature != 1)."""
        from vllm import SamplingParams
        self._note_generation()
        sp = SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=0,
                            stop_token_ids=[stop_token] if stop_token is not None else None, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        B = len(prompts) * n
        tokens = torch.full((B, max_tokens), pad, dtype=torch.long)
        logprobs = torch.zeros((B, max_tokens), dtype=torch.float32)
        lengths = torch.zeros(B, dtype=torch.long)
        for i, o in enumerate(outs):
            for j, c in enumerate(o.outputs):
                row, ids = i * n + j, list(c.token_ids)[:max_tokens]
                tokens[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                logprobs[row, :len(ids)] = torch.tensor([float(c.logprobs[k][t].logprob) for k, t in enumerate(ids)])
                lengths[row] = len(ids)
        self.generations.append(Generation(False, served_versions(self.versions)))
        return {"tokens": tokens, "logprobs": logprobs, "lengths": lengths}

    def greedy(self, prompts, max_tokens: int = 8) -> list[list[int]]:
        from vllm import SamplingParams
        self._note_generation()
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False, ignore_eos=True)
        return [list(o.outputs[0].token_ids) for o in
                self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)]
