"""Serving faults: the engine as RL stacks run it -- a KV-cache scale left at a placeholder, a graph-visible
buffer re-allocated on reload, a stale prefix cache served after a sync, a generation after a level-2 wake before
the weights were synced again. Each configures the serving setting it needs (FP8 KV cache, CUDA graphs, sleep
mode), so on engines already running that way it is live-injectable."""
from __future__ import annotations

from .base import Fault, NoTarget, register, with_rollout

register(Fault("kv_scale_placeholder", "serving", "engine", ("R1",),
               "a reload leaves one attention layer's KV-cache k scale at a placeholder (1e-4, as a dummy boot can; "
               "the kernels then quantize every cached key 10^4 times too coarsely)",
               knobs={"kv_scale_placeholder": 1e-4}, configure=with_rollout(kv_cache_dtype="fp8_e4m3"), silent=True))
register(Fault("graph_buffer_reallocated", "serving", "engine", ("R2",),
               "a reload rebinds a graph-visible buffer (the rotary cos/sin cache) to new storage: captured CUDA graphs "
               "keep reading the old one", knobs={"realloc_buffer": True}, configure=with_rollout(cuda_graphs=True),
               silent=True, destructive=True))        # nothing rebinds it: the engine serves the old storage on
register(Fault("prefix_cache_not_reset", "serving", "engine", ("R3",),
               "the prefix cache is not reset after the weight sync: a repeated prompt is served from state computed "
               "under the previous weights (only the cold-vs-warm differential sees it)",
               knobs={"keep_prefix_cache": True}, silent=True))
register(Fault("wake_without_resync", "serving", "serving", ("R4",),
               "after a level-2 sleep the engine wakes and serves a generation before the weights are synced again "
               "(its weights' memory is uninitialized)", knobs={"sleep_level": 2, "generate_before_sync": True},
               configure=with_rollout(sleep_mode=True), silent=True))


# -- the job's calibrated KV-cache scales (rollout.kv_scales=calibrated: they travel with every sync) ---------------
def _calibrated(**rollout):
    return with_rollout(kv_cache_dtype="fp8_e4m3", kv_scales="calibrated", **rollout)


def _has_attention(c) -> bool:
    return "full_attention" in c.spec.layer_types


def _drop_kv_scales(c, p, ctx):
    from .base import drop
    if not c.kv_scale_names:
        raise NoTarget("no calibrated KV-cache scale in this configuration")
    for n in c.kv_scale_names:
        p = drop(p, n)
    return p


register(Fault("kv_scales_not_synced", "serving", "payload", ("R1", "S1"),
               "a refit that never passes the job's calibrated KV-cache scales (NVIDIA-NeMo/RL#3226, colocated): "
               "the engine keeps its previous ones (1.0 from boot) while the learner calibrated others",
               _drop_kv_scales, configure=_calibrated(), applies=_has_attention, silent=True))
register(Fault("wake_resets_kv_scales", "serving", "serving", ("R1",),
               "the wake resets the calibrated FP8 KV-cache scales to 1.0, silently (vllm#45617)",
               knobs={"sleep_level": 1, "wake_kv_scales": {"k": 1.0, "v": 1.0}},
               configure=_calibrated(sleep_mode=True), applies=_has_attention, silent=True))
register(Fault("kv_scales_zeroed_by_level2_sleep", "serving", "serving", ("R1",),
               "a level-2 sleep zeroes the KV-cache scales (rebound as Parameters, missed by the buffer snapshot): "
               "NaN log-probs after a weights-only reload (vllm#57163)",
               knobs={"sleep_level": 2, "wake_kv_scales": {"k": 0.0, "v": 0.0}},
               configure=_calibrated(sleep_mode=True), applies=_has_attention, silent=True))
register(Fault("k_scale_zeroed_by_pause", "serving", "serving", ("R1",),
               "the KV k_scale lives in the weights region: pause / resume (a level-2 sleep) zeroes it, v_scale "
               "survives (sglang#27131)", knobs={"sleep_level": 2, "wake_kv_scales": {"k": 0.0}},
               configure=_calibrated(sleep_mode=True), applies=_has_attention, silent=True))
