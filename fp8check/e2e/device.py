"""The device sync path: the pipeline runs in the trainer's process, where its FP8 forward weights live on the
GPU, and drives the rollout engine (another process on the same GPU) through an attached client whose calls carry
CUDA tensors as CUDA IPC handles. Export, payload, buckets and the expected engine state and its digests stay on
the GPU; vLLM reads the payload device to device; only digests, the records and mismatching parameters cross to
a host. The catalog runs there too (checks are pure functions; where they run does not change them) and the
findings come back as plain data. LiveSession(device=True) calls these through `Remote.run_with_engine`.
"""
from __future__ import annotations

from fp8check.harness.config import SyncConfig
from fp8check.harness.engines.remote import Remote
from fp8check.harness.models import MODELS, ModelSpec, register_model
from fp8check.harness.sync.pipeline import DigestFirst, fault_config, run_sync

_STATE: dict = {}            # per trainer process: the export before the last step (faults mixing versions read it)


_CONFIGS: dict = {}          # the config's data (as JSON) -> the config: one object, and its derived sets, per run


def _config(data: dict) -> SyncConfig:
    """The sync's config, the same object for the same data: every sync of a run sends its config as data, and
    what a config derives once (FP8 sets, the expected wire, the layout's maps) was derived again every sync."""
    import json
    key = json.dumps(data, sort_keys=True, default=str)
    hit = _CONFIGS.get(key)
    if hit is None:
        hit = SyncConfig.from_dict(data, "device sync config")
        if len(_CONFIGS) >= 8:
            _CONFIGS.pop(next(iter(_CONFIGS)))
        _CONFIGS[key] = hit
    return hit


def device_warm(trainer, recipe: str) -> list:
    """The checks' kernels compiled in the trainer's process before the first sync (its capture and checks run
    here)."""
    import torch
    from fp8check.harness.formats.recipe import get_recipe
    from fp8check.harness.numerics.warmup import warm_kernels
    return warm_kernels(torch.device("cuda", torch.cuda.current_device()), get_recipe(recipe))


def device_freeze_heap(trainer) -> int:
    """Move every object this process holds now (the trainer's model, the libraries' state) to the collector's
    permanent generation, as vLLM's engine core does with its startup heap (vllm/v1/engine/core.py,
    `freeze_gc_heap`): a full collection otherwise walks the whole heap and lands in whichever sync's part
    allocated last (the checks', `checks.gc`). Returns how many objects were frozen."""
    import gc
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_ROLLOUTS: dict = {}         # (engine name, actor id) -> the attached client: asked what it is once, not every sync


def _attached(rollout_name: str, config, handle) -> Remote:
    key = (rollout_name, str(getattr(handle, "_actor_id", id(handle))))     # a Ray handle: its actor's id
    hit = _ROLLOUTS.get(key)
    if hit is None:
        hit = Remote.attach("rollout", rollout_name, config, handle, ipc=True)
        if len(_ROLLOUTS) >= 4:
            _ROLLOUTS.pop(next(iter(_ROLLOUTS)))
        _ROLLOUTS[key] = hit
    return hit


def device_step(trainer) -> int:
    _STATE["previous"] = trainer.export_hf()
    return trainer.optimizer_step()


def device_sync(trainer, rollout_handle, rollout_name: str, config_data: dict, spec_data: dict, *,
                fault: str | None = None, fault_params: dict | None = None, naive: bool = False,
                direct: bool = False, probes: bool = False, probe_bounds: dict | None = None,
                check_ids=None, prompts=None, resync: bool = True, periodic: bool = True, profile: int = 0,
                catalog: bool = True) -> dict:
    """One sync through the pipeline in the trainer's process; `profile`: with cProfile, its top `profile`
    functions by own and by cumulative time come back as text (bench/gpu_bench.py --profile)."""
    from fp8check.faults import FAULTS
    if spec_data["name"] not in MODELS:
        register_model(ModelSpec.from_dict(spec_data))
    config = _config(config_data)
    rollout = _attached(rollout_name, config, rollout_handle)
    f = FAULTS[fault].with_params(**(fault_params or {})) if fault else None
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    res = run_sync(fault_config(config, f), trainer, rollout, fault=f, capture=DigestFirst(),
                   previous=_STATE.get("previous"), naive=naive, direct=direct, probes=probes,
                   probe_bounds=probe_bounds, check_ids=check_ids, prompts=prompts, resync=resync, periodic=periodic,
                   catalog=catalog)
    text = None
    if prof is not None:
        import io
        import pstats
        prof.disable()
        buf = io.StringIO()
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(int(profile))
        text = buf.getvalue()
    return {"version": res.version, "findings": [x.to_json() for x in res.findings or []], "fetched": res.fetched,
            "params": res.params, "mismatching": res.mismatching[:20], "seconds": res.seconds,
            "errors": res.errors, "probes": res.probes, "deferred": res.deferred,
            "record": res.rollout.meta.to_json() if res.rollout.meta is not None else None,
            "payload_bytes": sum(t.numel() * t.element_size() for t in res.sent.tensors.values()), "profile": text}
