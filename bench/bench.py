"""fp8check CPU benchmarks: print figures and what bounds them, write JSON, assert nothing.
`fp8check bench [--quick] [--out FILE]` (or `python bench/bench.py`).

  quantize   blockwise / MXFP8 reference quantizer throughput on CPU (bound: memory traffic of the tiles)
  digest     the streaming state digest and the blake2b wire digest (bound: integer work per 32-bit word)
  sync       one reference sync + the full catalog, per tiny model (bound: Python per-tensor work)
  matrix     wall time of the whole CPU fault-injection matrix (goal: under 30 s on 2 cores)

Each figure is printed beside a floor measured in the same run, as a ratio ("x copy": the time of copying the same
input once, `clone`, the memory-traffic floor of any pass over it; the matrix: in reference cells, the time of one
clean tiny-dense cell in this process): machines differ by a quarter from run to run, ratios much less.
"""
import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout too


def timed(fn, n=3):
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench_quantize(out):
    from fp8check.harness.formats import quantize_blockwise, quantize_mxfp8
    x = torch.randn(4096, 4096).to(torch.bfloat16)
    mb = x.numel() * 2 / 2 ** 20
    floor = timed(lambda: x.clone(), 5)
    out.setdefault("quantize", {})["copy floor"] = {"seconds": floor, "MiBps": mb / floor}
    for name, fn in (("blockwise 128x128 fp32 scales", lambda: quantize_blockwise(x)),
                     ("blockwise 128x128 pow2 scales", lambda: quantize_blockwise(x, pow2=True)),
                     ("mxfp8 1x32", lambda: quantize_mxfp8(x))):
        t = timed(fn)
        out["quantize"][name] = {"seconds": t, "MiBps": mb / t, "x_copy": t / floor}
        print(f"quantize  {name:32s} 4096x4096 bf16: {t * 1e3:7.1f} ms  ({mb / t:7.1f} MiB/s, {t / floor:5.1f} x copy) "
              f"[bound: tile memory traffic]")


def bench_digest(out):
    from fp8check.harness.digest import state_digest
    from fp8check.harness.sync.payload import tensor_digest
    x = torch.randn(4096, 4096)
    mb = x.numel() * 4 / 2 ** 20
    floor = timed(lambda: x.clone(), 5)
    out.setdefault("digest", {})["copy floor"] = {"seconds": floor, "MiBps": mb / floor}
    for name, fn in (("state_digest (4 x 32-bit lanes)", lambda: state_digest(x)),
                     ("blake2b wire digest", lambda: tensor_digest(x))):
        t = timed(fn)
        out["digest"][name] = {"seconds": t, "MiBps": mb / t, "x_copy": t / floor}
        print(f"digest    {name:32s} 64 MiB fp32: {t * 1e3:7.1f} ms  ({mb / t:7.1f} MiB/s, {t / floor:5.1f} x copy) "
              f"[bound: per-word integer work]")


def bench_sync(out):
    from fp8check.harness.config import recommended_config
    from fp8check.harness.sync.pipeline import reference_sync
    from fp8check.invariants import run_catalog
    for model in ("tiny-dense", "tiny-moe", "tiny-hybrid"):
        cfg = recommended_config(model, "blockwise-fp32")
        reference_sync(cfg, checks=False)                     # warm the memoized trainer / engine state
        t0 = time.perf_counter()
        res, _, _ = reference_sync(cfg, checks=False)
        t1 = time.perf_counter()
        f = run_catalog(res.context())
        t2 = time.perf_counter()
        mib = sum(t.numel() * t.element_size() for t in res.sent.tensors.values()) / 2 ** 20
        out.setdefault("sync", {})[model] = {"payload_MiB": mib, "sync_resync_seconds": t1 - t0,
                                              "catalog_seconds": t2 - t1, "findings": len(f)}
        print(f"sync      {model:12s} payload {mib:5.1f} MiB, {len(res.sent.records)} tensors: sync+resync "
              f"{(t1 - t0) * 1e3:6.0f} ms, full catalog ({len(f)} findings) {(t2 - t1) * 1e3:6.0f} ms "
              f"[bound: Python per-tensor work]")


def reference_cell_seconds() -> float:
    """One clean tiny-dense blockwise-fp32 cell in this process (warmed once): the matrix's unit of work, measured
    in the same run as the matrix so that its time can be compared across machines as a ratio."""
    from fp8check.faults.matrix import run_cell
    run_cell(None, "tiny-dense", "blockwise-fp32")
    return timed(lambda: run_cell(None, "tiny-dense", "blockwise-fp32"), 3)


def bench_matrix(out, workers):
    from fp8check import faults  # noqa: F401
    from fp8check.faults.matrix import run_matrix, summary
    ref = reference_cell_seconds()
    t = time.perf_counter()
    cells = run_matrix(workers=workers)
    wall = time.perf_counter() - t
    s = summary(cells)
    out["matrix"] = {**s, "seconds": wall, "workers": workers, "reference_cell_seconds": ref,
                     "in_reference_cells": wall / ref}
    print(f"matrix    {s['applicable']} applicable cells of {s['cells']} ({s['caught']} caught, {s['missed']} missed, "
          f"{s['clean_pass']} clean pass, {s['false_alarms']} false alarms) in {wall:.1f} s on {workers} worker(s) "
          f"= {wall / ref:.0f} reference cells ({ref:.2f} s each, this run) "
          f"[goal < 30 s on 2 cores; bound: CPU reference syncs, one process per core]")


def run(quick: bool = False, workers: int | None = None, out_path: str | None = None) -> dict:
    workers = workers or len(os.sched_getaffinity(0))
    out = {"machine": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores",
           "torch": torch.__version__, "time": time.time()}
    print(f"# {out['machine']}, torch {torch.__version__}")
    bench_quantize(out)
    bench_digest(out)
    bench_sync(out)
    if not quick:
        bench_matrix(out, workers)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the full matrix")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    run(a.quick, a.workers, a.out)


if __name__ == "__main__":
    main()
