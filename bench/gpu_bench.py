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


def _share(r: dict) -> dict:
    """The catalog's cost beside the sync's: capture (+ S7's re-sync where it ran) + checks over export + install."""
    sync = r["export"] + r["install"]
    check = r["capture"] + r.get("resync", 0.0) + r.get("checks", 0.0)
    return {"sync_s": sync, "catalog_s": check, "fraction": check / sync if sync else None}


def _breakdown(r: dict, top: int = 5) -> str:
    parts = [f"{k.removeprefix('capture.')} {v * 1e3:.1f}" for k, v in r.items() if k.startswith("capture.")]
    checks = sorted(((v, k.removeprefix("check.")) for k, v in r.items() if k.startswith("check.")), reverse=True)
    return (f"capture [{', '.join(parts)}] ms; resync {r.get('resync', 0) * 1e3:.1f} ms; slowest checks "
            + ", ".join(f"{k} {v * 1e3:.1f}" for v, k in checks[:top]) + " ms")


def _copy_rate() -> float | None:
    """GB/s of input of one `clone` of 1 GiB on this process's GPU (the HBM floor the catalog is set beside)."""
    try:
        import torch
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        x.clone()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            x.clone()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        del x
        torch.cuda.empty_cache()
        return (1 << 30) / best / 1e9
    except Exception:  # noqa: BLE001 - no GPU in this process: the floor is not printed
        return None


def bench_sync(model: str, layers: int | None, steps: int, out: dict):
    """K clean syncs with every check (S7's re-sync included), then K without the re-sync (the idempotence probe is
    one more install by definition, so a check left on for every sync measures it on a schedule, not every time)."""
    from dataclasses import replace
    from e2e.live import LiveSession
    from harness.config import recommended_config
    from harness.models import get_model, with_layers
    depth = get_model(model).num_layers
    name = with_layers(model, None if layers is None else min(layers, depth))   # --layers cuts deeper models only
    cfg = recommended_config(name, "blockwise-fp32")
    cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    t0 = time.perf_counter()
    rows = {"with_resync": [], "without_resync": []}
    with LiveSession(cfg, device=True, num_gpus=0.1, rollout_kwargs={"gpu_memory_utilization": 0.3}) as s:
        start = time.perf_counter() - t0
        for mode, resync in (("with_resync", True), ("without_resync", False)):
            for i in range(steps):
                s.step()
                t = time.perf_counter()
                o = s.sync(f"bench step {i}", resync=resync)
                wall = time.perf_counter() - t
                rows[mode].append({"wall": wall, **o.seconds, "fired": o.fired, "unknown": o.unknown,
                                   "fetched": o.fetched, "params": o.params,
                                   "payload_bytes": o.extra.get("payload_bytes")})
    rate = _copy_rate()
    res = {"engine_start_seconds": start, "steps": rows, "copy_GBps": rate}
    for mode, rs in rows.items():
        best = min(rs[1:] or rs, key=lambda r: r["wall"])
        first = rs[0]
        gb = (best["payload_bytes"] or 0) / 1e9
        sh, fsh = _share(best), _share(first)
        mem = best.get("check_extra_peak_bytes", 0)
        res[mode] = {"best": best, "payload_GB": gb, "install_GBps": gb / best["install"] if best["install"] else None,
                     "catalog_fraction_of_sync": sh["fraction"], "first_sync_catalog_fraction": fsh["fraction"],
                     "extra_peak_fraction_of_payload": mem / best["payload_bytes"] if best["payload_bytes"] else None}
        print(f"sync      {name} ({mode.replace('_', ' ')}): payload {gb:.2f} GB in {best['params']} parameters; "
              f"export {best['export']:.3f} s, install {best['install']:.3f} s ({res[mode]['install_GBps'] or 0:.1f} "
              f"GB/s), capture {best['capture']:.3f} s, re-sync {best.get('resync', 0):.3f} s, checks "
              f"{best.get('checks', 0):.3f} s; catalog = {sh['fraction']:.1%} of the sync (target 10 %; first sync "
              f"{fsh['fraction']:.1%}); checks' extra peak {mem / 2**20:.0f} MiB = "
              f"{res[mode]['extra_peak_fraction_of_payload'] or 0:.1%} of the payload (target 5 %); fired "
              f"{best['fired']} unknown {best['unknown']}")
        if rate:    # reading the payload once on each side at the copy rate: what a digest-first catalog needs
            floor = 2 * (best["payload_bytes"] or 0) / 1e9 / rate
            res[mode]["floor_seconds"] = floor
            print(f"          floor (the payload read once per side at {rate:.0f} GB/s): {floor * 1e3:.1f} ms; "
                  f"capture x{best['capture'] / floor:.1f} of it, catalog x{sh['catalog_s'] / floor:.0f}")
        print(f"          {_breakdown(best)}; extra peak: capture {best.get('capture_extra_peak_bytes', 0) / 2**20:.0f} "
              f"MiB, checks {best.get('checks_extra_peak_bytes', 0) / 2**20:.0f} MiB")
    print("          [bounds: install = vLLM's layerwise reload reading IPC-mapped buckets; re-sync = one more "
          "install; capture = digests (one HBM read per side) + per-tensor Python; floor: reading the payload "
          "once per side at ~2 TB/s]")
    out.setdefault("sync", {})[name] = res


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
