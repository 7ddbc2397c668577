"""GPU benchmarks on the H200 (prints figures, writes JSON, asserts nothing): python bench/gpu_bench.py [--quantize]
[--sync MODEL ...] [--layers N] [--steps K] --out FILE.

  --quantize   quantizer throughput (bench/gpu_quantize.py: clone, TE, the Triton kernel, the reference on CUDA)
               and the streaming state digest's rate and extra memory
  --sync M     the device sync path (trainer and vLLM colocated as Ray actors, weights GPU to GPU through CUDA IPC,
               expected digests on the trainer's GPU): seconds per stage over K clean syncs, payload GB and GB/s,
               the catalog's share of the sync, the checks' extra peak GPU memory, vLLM's own reload beside it

What bounds each figure is printed with it: HBM bandwidth for the quantizer and digests, the layerwise reload
and CUDA IPC mapping for install, Python per-tensor work for capture at small shapes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_digest(out: dict):
    import torch
    from harness.digest import state_digest
    x = torch.randn(1 << 28, device="cuda")           # 1 GiB fp32
    state_digest(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        state_digest(x)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    extra = torch.cuda.max_memory_allocated() - base
    out["digest"] = {"bytes": x.numel() * 4, "seconds": best, "GBps": x.numel() * 4 / best / 1e9,
                     "extra_peak_bytes": int(extra), "bound": "HBM read (one pass) + integer multiply-adds"}
    print(f"digest    1 GiB fp32: {best * 1e3:.2f} ms = {out['digest']['GBps']:.0f} GB/s, extra peak "
          f"{extra / 2**20:.1f} MiB [bound: one HBM read + per-word integer work]")


def bench_sync(model: str, layers: int | None, steps: int, out: dict):
    from dataclasses import replace
    from e2e.live import LiveSession
    from harness.config import recommended_config
    from harness.models import get_model, with_layers
    depth = get_model(model).num_layers
    name = with_layers(model, None if layers is None else min(layers, depth))   # --layers cuts deeper models only
    cfg = recommended_config(name, "blockwise-fp32")
    cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    t0 = time.perf_counter()
    rows = []
    with LiveSession(cfg, device=True, num_gpus=0.1, rollout_kwargs={"gpu_memory_utilization": 0.3}) as s:
        start = time.perf_counter() - t0
        for i in range(steps):
            s.step()
            t = time.perf_counter()
            o = s.sync(f"bench step {i}")
            wall = time.perf_counter() - t
            rows.append({"wall": wall, **o.seconds, "fired": o.fired, "unknown": o.unknown, "fetched": o.fetched,
                         "params": o.params, "payload_bytes": o.extra.get("payload_bytes")})
    best = min(rows[1:] or rows, key=lambda r: r["wall"])
    sync = best["export"] + best["install"]
    check = best["capture"] + best.get("checks", 0.0)
    out.setdefault("sync", {})[name] = {"engine_start_seconds": start, "steps": rows, "best": best,
                                       "payload_GB": (best["payload_bytes"] or 0) / 1e9,
                                       "install_GBps": (best["payload_bytes"] or 0) / best["install"] / 1e9,
                                       "check_fraction_of_sync": check / sync if sync else None}
    print(f"sync      {name}: payload {(best['payload_bytes'] or 0) / 1e9:.2f} GB; export {best['export']:.3f} s, "
          f"install {best['install']:.3f} s ({(best['payload_bytes'] or 0) / best['install'] / 1e9:.1f} GB/s), "
          f"capture {best['capture']:.3f} s, checks {best.get('checks', 0):.3f} s; catalog = {check / sync:.1%} of the "
          f"sync; checks' extra peak {best.get('check_extra_peak_bytes', 0) / 2**20:.0f} MiB; fired {best['fired']} "
          f"[bounds: install = vLLM's layerwise reload reading IPC-mapped buckets; capture = digests (HBM) + "
          f"per-tensor Python]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--sync", action="append", default=[])
    ap.add_argument("--layers", type=int, help="cut models deeper than this to this many layers")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {"time": time.time()}
    try:
        if a.quantize:
            from bench.gpu_quantize import bench_quantizers
            out["quantize"] = bench_quantizers(a.out + ".quantize.json")
            bench_digest(out)
        for m in a.sync:
            try:
                bench_sync(m, a.layers, a.steps, out)
            except Exception as e:  # noqa: BLE001 - report and go on to the next model
                out.setdefault("errors", {})[m] = f"{e.__class__.__name__}: {e}"
                print(f"sync      {m}: FAILED {e.__class__.__name__}: {e}")
    finally:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
