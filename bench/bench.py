"""fp8check benchmarks: print figures, assert nothing. `python bench/bench.py [--quick]`

  matrix     wall time of the whole CPU fault-injection matrix (goal: under 60 s on a 2-core machine)
  sync       one reference sync + the full catalog, per tiny model
  quantize   blockwise / MXFP8 quantizer throughput on CPU
  digest     device-digest throughput (the digest-first capture of live checks)
"""
import argparse
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


def bench_quantize():
    from harness.formats import quantize_blockwise, quantize_mxfp8
    x = torch.randn(4096, 4096).to(torch.bfloat16)
    mb = x.numel() * 2 / 2 ** 20
    for name, fn in (("blockwise 128x128 fp32 scales", lambda: quantize_blockwise(x)),
                     ("blockwise 128x128 pow2 scales", lambda: quantize_blockwise(x, pow2=True)),
                     ("mxfp8 1x32", lambda: quantize_mxfp8(x))):
        t = timed(fn)
        print(f"quantize  {name:32s} 4096x4096 bf16: {t * 1e3:7.1f} ms  ({mb / t:7.1f} MiB/s)")


def bench_digest():
    from harness.digest import state_digest
    from harness.engines.digest import device_digest
    from harness.sync.payload import tensor_digest
    x = torch.randn(4096, 4096)
    mb = x.numel() * 4 / 2 ** 20
    for name, fn in (("state_digest (4 x 32-bit lanes)", lambda: state_digest(x)),
                     ("device_digest (int64 polynomial)", lambda: device_digest(x)),
                     ("blake2b manifest digest", lambda: tensor_digest(x))):
        t = timed(fn)
        print(f"digest    {name:32s} 64 MiB fp32: {t * 1e3:7.1f} ms  ({mb / t:7.1f} MiB/s)")


def bench_sync():
    from harness.config import recommended_config
    from harness.snapshot import Snapshot
    from harness.sync.session import reference_sync
    from invariants import CheckContext, run_catalog
    for model in ("tiny-dense", "tiny-moe", "tiny-hybrid"):
        cfg = recommended_config(model, "blockwise-fp32")
        reference_sync(cfg)                                   # warm the memoized trainer / engine state
        t0 = time.perf_counter()
        res, trainer, _ = reference_sync(cfg)
        t1 = time.perf_counter()
        f = run_catalog(CheckContext(cfg, res.payload, res.trainer, res.rollout, Snapshot("master", trainer.master_hf())))
        t2 = time.perf_counter()
        mib = sum(t.numel() * t.element_size() for t in res.sent.tensors.values()) / 2 ** 20
        print(f"sync      {model:12s} payload {mib:5.1f} MiB, {len(res.sent.records)} tensors: sync+resync "
              f"{(t1 - t0) * 1e3:6.0f} ms, full catalog ({len(f)} findings) {(t2 - t1) * 1e3:6.0f} ms")


def bench_matrix(workers):
    import faults  # noqa: F401
    from faults.matrix import run_matrix, summary
    t = time.perf_counter()
    cells = run_matrix(workers=workers)
    wall = time.perf_counter() - t
    s = summary(cells)
    print(f"matrix    {s['applicable']} applicable cells of {s['cells']} ({s['caught']} caught, {s['missed']} missed, "
          f"{s['clean_pass']} clean pass, {s['false_alarms']} false alarms) in {wall:.1f} s on {workers} worker(s) "
          f"[goal < 60 s]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the full matrix")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}")
    bench_quantize()
    bench_digest()
    bench_sync()
    if not a.quick:
        bench_matrix(a.workers)


if __name__ == "__main__":
    main()
