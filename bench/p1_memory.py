"""P1's extra peak memory and time on the CPU reference (prints figures, asserts nothing):
python bench/p1_memory.py [--model qwen3-0.6b] [--layers 4]

One reference sync without checks, then P1 alone on its snapshots; the process's peak RSS (`ru_maxrss`) before and
after P1 says what P1's reference forwards added on top of the sync. Bound: one layer of fp32 weights per forward
(P1 dequantizes when it reads and runs the prompts layer by layer).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--recipe", default="blockwise-fp32")
    a = ap.parse_args()
    from fp8check.harness.config import recommended_config
    from fp8check.harness.models import with_layers
    from fp8check.harness.sync.pipeline import reference_sync
    from fp8check.invariants import run_catalog
    cfg = recommended_config(with_layers(a.model, a.layers), a.recipe)
    res, _, _ = reference_sync(cfg, steps=1, checks=False)
    ctx = res.context(None)
    _ = ctx.rollout_hf
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    f = run_catalog(ctx, ids=["P1"])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"P1 on {cfg.model} ({a.recipe}): {f[0].verdict}, {time.perf_counter() - t:.1f} s; peak RSS {before:.0f} MiB "
          f"after the sync, {after:.0f} MiB after P1: P1 added {after - before:.0f} MiB [bound: one layer of fp32 "
          f"weights per forward]")


if __name__ == "__main__":
    main()
