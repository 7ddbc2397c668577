"""How the seeds' naive configuration separates from on-policy FP8 as the model grows, on the CPU engines:
`python bench/e2e_scaling.py [--hidden 256 512 1024] [--seeds 3] [--steps 20] [--out FILE.json]`.

For each width a tiny-rl-shaped model (2 layers, heads of 128, MLP 2x the width, vocabulary 128) runs the arms
`naive-fp8` and `onpolicy-fp8` through the same loop, sync pipeline and catalog as `fp8check e2e`; printed per width:
the paired ratio of mean |dlogprob| naive / on-policy over the comparison's window (e2e/rl/claims.py), and the
fraction of naive's syncs where S2 failed (where the learner's delayed scale and the engine's current scale gave
different codes). Prints figures, asserts nothing: the report of `fp8check e2e` quotes what this measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout too


def width_model(hidden: int):
    from fp8check.harness.models import MODELS, ModelSpec, register_model
    name = f"tiny-rl-{hidden}"
    if name not in MODELS:
        register_model(ModelSpec(name, "Qwen3ForCausalLM", "qwen3", vocab_size=128, hidden_size=hidden,
                                 num_heads=hidden // 128, num_kv_heads=hidden // 128, intermediate_size=2 * hidden))
    return name


def measure(hidden: int, seeds: int, steps: int) -> dict:
    from fp8check.e2e.rl.claims import Tolerances, ratio_claim
    from fp8check.e2e.rl.loop import LoopSettings, run_comparison
    model = width_model(hidden)
    t0 = time.perf_counter()
    # one process: the widths are registered here, not in spawned workers
    res = run_comparison(["naive-fp8", "onpolicy-fp8"], seeds, steps, LoopSettings(model=model), jobs=1)
    tol = Tolerances()
    c = ratio_claim("naive-over-onpolicy", res["steps"], "naive-fp8", "onpolicy-fp8", tol.naive_over_onpolicy_min,
                    True, first=tol.window_steps)
    naive = [r for r in res["steps"] if r["arm"] == "naive-fp8"]
    s2_fail = sum(1 for r in naive if r["sync"]["verdicts"].get("S2") == "fail")
    return {"hidden": hidden, "model": model, "seeds": seeds, "steps": steps, "ratio": c.get("estimate"),
            "verdict": c["verdict"], "detail": c["detail"], "naive_syncs": len(naive), "naive_s2_failed": s2_fail,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for h in a.hidden:
        r = measure(h, a.seeds, a.steps)
        rows.append(r)
        e = r["ratio"] or {}
        print(f"hidden {h:5d}: naive / on-policy mean |dlogprob| {e.get('mean', float('nan')):.3g} "
              f"[{e.get('low', float('nan')):.3g}, {e.get('high', float('nan')):.3g}] ({r['verdict']} vs > 1.5); "
              f"naive S2 failed at {r['naive_s2_failed']} of {r['naive_syncs']} syncs; {r['seconds']:.0f} s",
              flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
