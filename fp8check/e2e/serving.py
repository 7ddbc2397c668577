"""The colocated phase loop, as RL stacks run the engine: sync -> generate -> sleep (level 1 or 2) -> train step
-> wake -> sync -> generate, with CUDA graphs and an FP8 KV cache when the config says so, every phase checked:
the serving checks (R1 KV scales, R2 graph-visible storage, R4 wake) after boot and every wake, the whole catalog
after every sync, and at the end the cold-vs-warm differential (R3) against a fresh engine given the same weights.
Serving faults are injected into the running engines and each must be caught at the first sync or wake after it.
"""
from __future__ import annotations

import time

from fp8check.harness.config import SyncConfig
from fp8check.harness.engines.remote import Remote
from fp8check.harness.snapshot import Snapshot
from fp8check.harness.sync.pipeline import DigestFirst, cold_warm, differential_prompts
from fp8check.invariants import FAIL, REGISTRY, UNKNOWN, CheckContext, run_catalog

from .live import LiveSession

SERVING_FAULTS = ("kv_scale_placeholder", "graph_buffer_reallocated", "prefix_cache_not_reset", "wake_without_resync")


def _verdicts(findings) -> dict:
    """Fired and unknown ids, the non-passing findings, and P1's metrics, bounds and floor whatever its verdict (a
    passing probe's margin is what tells a drifting engine from a sound one; the H200's serving loop failed once
    with no green phase's margin on record)."""
    out = {"fired": sorted({f.invariant_id for f in findings if f.verdict == FAIL}),
           "unknown": sorted({f.invariant_id for f in findings if f.verdict == UNKNOWN}),
           "findings": [f.to_json() for f in findings if f.verdict != "pass"][:12]}
    probe = next((f for f in findings if f.invariant_id == "P1" and f.evidence), None)
    if probe is not None:
        out["probe"] = {k: probe.evidence.get(k) for k in ("metrics", "bounds", "floor", "source", "learner", "sampler")}
    return out


def serving_checks(config: SyncConfig, rollout, ids) -> list:
    """The serving checks on the engine's state now (no sync: after boot or a wake)."""
    ctx = CheckContext(config, rollout=Snapshot("rollout", {}, rollout.record()))
    return run_catalog(ctx, ids=[i for i in ids if REGISTRY[i].applies is None or REGISTRY[i].applies(config)])


def phase_loop(config: SyncConfig, *, steps: int = 3, levels=(1, 2), faults=SERVING_FAULTS, session=None,
               cold_engine: str | None = None, cold_kwargs: dict | None = None, **session_kw) -> dict:
    """Run the loop; returns a report of every phase and fault. `cold_engine`: the registered rollout engine
    started fresh for the differential (default: the session's kind), released at the end."""
    from fp8check.faults import FAULTS
    own = session is None
    s = session or LiveSession(config, **session_kw)
    prompts = differential_prompts(config.spec.vocab_size)
    report = {"config": config.to_dict(), "phases": [], "faults": [], "differential": None}

    def note(label, findings, **extra):
        report["phases"].append({"phase": label, **_verdicts(findings), **extra})

    no_wake_yet = [i for i in REGISTRY if i != "R4" and REGISTRY[i].scope not in ("job", "differential")]
    try:
        t0 = time.perf_counter()
        rec = s.rollout.record()
        report["boot_kv_scales"] = {k: vars(v) for k, v in (rec.serving.boot_kv_scales or {}).items()} \
            if rec.serving else None
        note("boot", serving_checks(config, s.rollout, ["R1", "R2"]))
        s.step()
        o = s.sync(f"sync step {s.version}", probes=True, check_ids=no_wake_yet)
        note(o.label, o.findings, seconds=o.seconds)
        s.rollout.measure_outputs(prompts)
        for i in range(steps):
            level = levels[i % len(levels)]
            s.rollout.sleep(level)
            s.step()                                   # the train step while the engine sleeps
            s.rollout.wake()
            note(f"wake level {level}", serving_checks(config, s.rollout, ["R1", "R2"] + (["R4"] if level == 1 else [])))
            o = s.sync(f"sync step {s.version} after a level-{level} wake", probes=True)
            note(o.label, o.findings, seconds=o.seconds)
            s.rollout.measure_outputs(prompts)
        report["loop_seconds"] = round(time.perf_counter() - t0, 2)
        # the oracle: the warm engine, synced once more, against a fresh engine given the same weights
        cold = Remote("rollout", cold_engine or s.rollout.name, config, ray=s.rollout.in_ray, num_gpus=0.2,
                      **(cold_kwargs or {}))
        try:
            s.step()
            res = cold_warm(config, s.trainer, s.rollout, cold, capture=DigestFirst(), previous=s.previous_hf)
            report["differential"] = {"label": f"cold vs warm at step {res.version}", **_verdicts(res.findings)}
            for name in sorted(faults, key=lambda n: FAULTS[n].destructive):
                f = FAULTS[name]
                if not f.live_injectable(config, s.rollout.knobs):
                    report["faults"].append({"fault": name, "verdict": "n/a"})
                    continue
                s.step()
                if "R3" in f.declared:
                    r = cold_warm(config, s.trainer, s.rollout, cold, fault=f, capture=DigestFirst(),
                                  previous=s.previous_hf)
                    fired = _verdicts(r.findings)
                else:
                    fired = _verdicts(s.sync(name, fault=f).findings)
                report["faults"].append({"fault": name, "must_trip": list(f.trips),
                                         "verdict": f.verdict(fired["fired"]), **fired})
                # the repair an RL loop makes anyway: a sleep/wake cycle (scales pinned again), then a clean sync
                s.rollout.sleep(1)
                s.rollout.wake()
                again = s.sync(f"clean re-sync after {name}")
                report["phases"].append({"phase": again.label, "after_destructive": f.destructive,
                                         **_verdicts(again.findings)})
                s.rollout.measure_outputs(prompts)     # ... and generates (the next fault finds a warm engine)
        finally:
            cold.close()
        return report
    finally:
        if own:
            s.close()


def loop_ok(report: dict) -> bool:
    """Every phase green (except re-syncs after a destructive fault, which must keep saying so), the differential
    green, every applicable fault caught."""
    return all(not p["fired"] and not p["unknown"] for p in report["phases"] if not p.get("after_destructive")) and \
        report["differential"] is not None and not report["differential"]["fired"] and \
        not report["differential"]["unknown"] and all(f["verdict"] in ("caught", "n/a") for f in report["faults"])
