"""R family: the engine as RL stacks run it -- FP8 KV-cache scales, CUDA-graph-visible storage, sleep/wake, and
the cold-vs-warm differential (vLLM RFC #48312's oracle: an engine that held A and was synced to B must behave
exactly like a fresh engine loaded with B). Each reads the serving state in the engine record
(EngineRecord.serving); a condition absent from the configuration (no FP8 KV cache, eager decoding, no sleep
mode) is not checked, and a record that lacks what a check needs is UNKNOWN.
"""
from __future__ import annotations

import math

from fp8check.harness.layouts import split_rank_name
from fp8check.harness.layouts.vllm import checkpoint_name

from .base import CheckContext, fail, invariant, passed, unknown


def _serving(ctx: CheckContext):
    return ctx.rollout.meta.serving if ctx.rollout is not None and ctx.rollout.meta is not None else None


def _declared_kv(ctx: CheckContext):
    """Attention layer (as the engine reports it) -> {"k": v, "v": v, ...} the kernels must read, or a reason.
    k and v as `harness.numerics.kv_cache.declared_kv_scales` rules (P1's forward reads K and V through the same);
    a uniform cache's q and prob are rollout.kv_scale too, a calibrated one's are not calibrated and not judged."""
    from fp8check.harness.numerics.kv_cache import declared_kv_scales      # torch: not on the pre-flight path
    cfg = ctx.config
    layers = sorted(_serving(ctx).kv_scales)
    # the checkpoint's attention module of each engine layer (model.layers.N.self_attn)
    module = {layer: checkpoint_name(cfg.spec, split_rank_name(layer)[1].removesuffix(".attn")) for layer in layers}
    scales = declared_kv_scales(cfg, ctx.trainer, sorted(set(module.values())))
    if isinstance(scales, str):
        return scales
    extra = {} if cfg.calibrated_kv else {"q": cfg.rollout.kv_scale, "prob": cfg.rollout.kv_scale}
    return {layer: {**scales[module[layer]], **extra} for layer in layers}


def _judge_kv(scales: dict, want: dict, when: str, what: str) -> list:
    out = []
    for layer, sc in sorted(scales.items()):
        for which, exp in sorted(want.get(layer, {}).items()):
            v = getattr(sc, which)
            if v is None:                # a declared scale the engine did not report: not judged, never passed
                out.append(unknown("R1", f"{which} scale {when}: the engine reported none, {what} {exp!r}",
                                   tensor=f"{layer}._{which}_scale", expected=exp, when=when))
            elif not math.isfinite(v) or v <= 0:
                out.append(fail("R1", f"{layer}._{which}_scale", f"{which} scale {v!r} {when} is not finite and "
                                "positive", value=v, expected=exp, when=when))
            elif v != exp:
                out.append(fail("R1", f"{layer}._{which}_scale", f"{which} scale {v!r} {when}, {what} {exp!r}",
                                value=v, expected=exp, when=when))
    return out


@invariant("R1", "serving", "KV-cache scales as declared",
           "with an FP8 KV cache every attention layer's k / v (and q / prob) scales are finite, positive and equal to "
           "the declared ones -- rollout.kv_scale, or the job's per-layer calibration the sync carries -- after boot, "
           "after every sync and after every wake", needs=("rollout",),
           applies=lambda c: c.fp8_kv_cache,
           source="vLLM 0.26 model_executor/layers/quantization/kv_cache.py (dummy boot randomizes the scale "
                  "parameters); SkyRL re-initializes FP8 KV scales after every wake; NVIDIA-NeMo/RL#3226 (a refit "
                  "that never passed the calibrated scales), vllm#45617 (wake resets them to 1.0), vllm#57163 "
                  "(level-2 sleep zeroes them), sglang#27131 (k_scale zeroed by pause/resume)",
           why="a KV scale left at a dummy-boot, reset or zeroed value quantizes every cached key and value with the "
               "wrong scale: log-probs go NaN or silently wrong while the weights are byte-exact")
def r1_kv_scales(ctx: CheckContext):
    sv = _serving(ctx)
    if sv is None or sv.kv_scales is None:
        return [unknown("R1", "the engine record has no KV-cache scales (the engine did not report them)")]
    if not sv.kv_scales:
        return [unknown("R1", "the engine reported no attention layer with KV-cache scales")]
    want = _declared_kv(ctx)
    if isinstance(want, str):
        return [unknown("R1", want)]
    what = "the calibration this sync carries declares" if ctx.config.calibrated_kv else "the config declares"
    out = _judge_kv(sv.kv_scales, want, "after the sync", what)
    w = sv.wake
    if w is not None and w.kv_scales is not None and w.syncs_since <= 1:     # the wake before this sync
        if ctx.config.calibrated_kv:      # the calibration held before the sleep is what the wake must keep
            before = {layer: {k: getattr(sc, k) for k in ("k", "v") if getattr(sc, k) is not None}
                      for layer, sc in (w.kv_scales_before or {}).items()}
            out += _judge_kv(w.kv_scales, before, f"after the level-{w.level} wake", "before the sleep it was")
        else:
            out += _judge_kv(w.kv_scales, want, f"after the level-{w.level} wake", what)
    if out:
        return sorted(out, key=lambda f: f.verdict != "fail")[:20]      # failures first, then what was not judged
    return [passed("R1", f"{len(sv.kv_scales)} attention layers serve the declared KV scales "
                         f"({'calibrated per layer' if ctx.config.calibrated_kv else repr(ctx.config.rollout.kv_scale)})")]


@invariant("R2", "serving", "graph-visible storage stays",
           "with CUDA graphs every tensor the captured graphs read (parameters, buffers, KV cache) keeps its storage "
           "across every sync and wake", needs=("rollout",), applies=lambda c: c.rollout.cuda_graphs,
           source="vLLM #48941 / #50521 (reload moves graph-visible pointers), #41670",
           why="a captured graph replays raw device pointers: a tensor re-allocated on reload or wake is served stale "
               "(or freed memory) while every read of the parameter looks right")
def r2_graph_storage(ctx: CheckContext):
    sv = _serving(ctx)
    if sv is None or sv.graph_storage_moved is None:
        return [unknown("R2", "the engine record has no graph-visible storage record")]
    if not sv.graph_storage:
        return [unknown("R2", "the engine watched no graph-visible tensor")]
    out = [fail("R2", n, "graph-visible storage moved since the graphs were captured: replays read the old tensor")
           for n in sv.graph_storage_moved]
    return out[:20] or [passed("R2", f"{sv.graph_storage} graph-visible tensors kept their storage")]


@invariant("R3", "serving", "cold-vs-warm differential",
           "an engine that held other weights and was synced to these equals a fresh engine given these: parameter "
           "bytes, KV-cache scales, greedy outputs and prompt log-probs on fixed prompts", needs=("rollout", "cold"),
           source="vLLM RFC #48312; SGLang #28676 (a derived MoE cache lost across pause/resume)",
           why="state the sync does not write (a derived cache, a stale prefix cache, a scale reset) makes a warm "
               "engine serve another policy than the one it was given")
def r3_cold_warm(ctx: CheckContext):
    warm, cold = ctx.rollout, ctx.cold
    out = []
    wn, cn = set(warm.names()), set(cold.names())
    for n in sorted(wn ^ cn):
        out.append(fail("R3", n, "held by only one of the warm and the cold engine"))
    from .evidence import bit_diff
    for n in sorted(wn & cn):
        ev = bit_diff(cold[n], warm[n])
        if ev:
            out.append(fail("R3", n, "warm engine's bytes differ from a fresh engine given the same sync", **ev))
    ws, cs = _serving(ctx), cold.meta.serving if cold.meta is not None else None
    if ws is None or cs is None:
        out.append(unknown("R3", "serving state missing on the warm or the cold engine (outputs not compared)"))
    else:
        if ws.kv_scales is not None and cs.kv_scales is not None and ws.kv_scales != cs.kv_scales:
            layer = next(k for k in sorted(set(ws.kv_scales) | set(cs.kv_scales))
                         if ws.kv_scales.get(k) != cs.kv_scales.get(k))
            out.append(fail("R3", layer, f"KV scales warm {ws.kv_scales.get(layer)} vs cold {cs.kv_scales.get(layer)}"))
        if ws.outputs is None or cs.outputs is None:
            out.append(unknown("R3", "greedy outputs were not measured on both engines"))
        else:
            for what in ("greedy", "prompt_logprobs"):    # zip below stops at the shorter: the counts first
                nw, nc = len(getattr(ws.outputs, what)), len(getattr(cs.outputs, what))
                if nw != nc:
                    out.append(fail("R3", None, f"the warm engine answered {nw} prompts ({what}), a fresh engine "
                                                f"{nc}", warm=nw, cold=nc))
            for i, (a, b) in enumerate(zip(ws.outputs.greedy, cs.outputs.greedy)):
                if a != b:
                    j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    out.append(fail("R3", f"prompt {i}", f"greedy outputs differ from token {j}: warm {a[j:j + 4]} vs "
                                    f"cold {b[j:j + 4]}", prompt=i, token=j))
            for i, (a, b) in enumerate(zip(ws.outputs.prompt_logprobs, cs.outputs.prompt_logprobs)):
                if a != b:
                    d = max(abs(x - y) for x, y in zip(a, b)) if a and b else float("inf")
                    out.append(fail("R3", f"prompt {i}", f"prompt log-probs differ (max |d| {d:.3g}) from a fresh "
                                    f"engine's", prompt=i, max_abs=d))
    if out:
        return out[:20]
    return [passed("R3", f"{len(wn)} parameters, KV scales and outputs equal a fresh engine's")]


@invariant("R4", "serving", "wake restores the installed state",
           "after a level-1 wake every parameter holds the bytes it held before sleep; after a level-2 wake a weight "
           "sync runs before any generation", needs=("rollout",), applies=lambda c: c.rollout.sleep_mode,
           source="vLLM 0.26 device_allocator/cumem.py (level 1 offloads weights, level 2 discards them)",
           why="a level-2 wake leaves the weights' memory uninitialized: generation before the next sync samples "
               "garbage; a level-1 wake that does not restore every byte serves a policy nobody synced")
def r4_wake(ctx: CheckContext):
    sv = _serving(ctx)
    if sv is None:
        return [unknown("R4", "the engine record has no serving state")]
    w = sv.wake
    if w is None:
        return [unknown("R4", "nothing to check: no sleep/wake cycle since the engine started")]
    if w.level == 1 and w.changed:
        return [fail("R4", n, "a level-1 wake did not restore this parameter's bytes") for n in w.changed[:20]]
    if w.level == 2 and w.generated_before_sync:
        return [fail("R4", None, "generation served after a level-2 wake before the weights were synced again "
                                 "(the weights' memory is uninitialized after a level-2 sleep)")]
    return [passed("R4", f"level-{w.level} wake: {'bytes restored' if w.level == 1 else 'synced before serving'}")]
