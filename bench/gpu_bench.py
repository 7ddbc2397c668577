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


def _best(fn, reps: int = 5) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def _sweep_blocks(module, counts, measure) -> tuple[int, dict]:
    """(the module's default BLOCKS_PER_PROGRAM, {count: measure()} with it set to each count), the default put
    back whatever happens: a kernel's launch shape, swept in one run."""
    default, sweep = module.BLOCKS_PER_PROGRAM, {}
    try:
        for g in counts:
            module.BLOCKS_PER_PROGRAM = g
            sweep[g] = measure()
    finally:
        module.BLOCKS_PER_PROGRAM = default
    return default, sweep


def bench_digest(out: dict):
    """The capture's and the per-sync checks' kernels beside the HBM copy rate measured in the same run: the state
    digest (16-byte vector loads; 4-byte ones for an unaligned start), and S3's zero-block screen over a
    Llama-8B-layer-shaped set of FP8 weights."""
    import torch
    from fp8check.harness.digest import state_digest
    from fp8check.harness.formats.zero_blocks import zero_block_flags
    rate = _copy_rate()
    x = torch.randn(1 << 28, device="cuda")           # 1 GiB fp32
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    best = _best(lambda: state_digest(x))
    extra = torch.cuda.max_memory_allocated() - base
    raw = x.view(torch.uint8)[4:]                      # the same bytes from a 4-byte-aligned start: scalar loads
    unaligned = _best(lambda: state_digest(raw))
    gbps = x.numel() * 4 / best / 1e9
    out["digest"] = {"bytes": x.numel() * 4, "seconds": best, "GBps": gbps, "unaligned_GBps": raw.numel() / unaligned / 1e9,
                     "copy_GBps": rate, "over_copy_rate": gbps / rate if rate else None,
                     "extra_peak_bytes": int(extra), "bound": "one HBM read + ~16 integer operations a word"}
    print(f"digest    1 GiB fp32: {best * 1e3:.2f} ms = {gbps:.0f} GB/s = {gbps / (rate or gbps):.2f} of the copy rate "
          f"({rate or 0:.0f} GB/s of input); 4-byte-aligned start {out['digest']['unaligned_GBps']:.0f} GB/s; extra "
          f"peak {extra / 2**20:.1f} MiB [bound: one HBM read + per-word integer work]")
    # blocks a program sums (harness.digest_triton.BLOCKS_PER_PROGRAM): the same sums, another launch shape
    from fp8check.harness import digest_triton as dt
    want = state_digest(x)
    default, sweep = _sweep_blocks(dt, (1, 2, 4, 8), lambda: {
        "same": state_digest(x) == want, "GBps": x.numel() * 4 / _best(lambda: state_digest(x)) / 1e9})
    out["digest"]["blocks_per_program"] = {"default": default, **{str(g): v for g, v in sweep.items()}}
    print("digest    blocks a program sums: " + ", ".join(
        f"{g}{' [default]' if g == default else ''} {v['GBps']:.0f} GB/s{'' if v['same'] else ' DIFFERENT SUMS'}"
        for g, v in sweep.items()))
    del x, raw
    shapes = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (12288, 4096), (12288, 4096), (4096, 12288)]
    pairs = [(torch.randint(1, 127, s, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn),
              torch.rand(s[0] // 128, s[1] // 128, device="cuda") + 0.5) for s in shapes * 4]
    pairs[5][0].view(torch.uint8)[128:256, 1280:1408] = 0          # one wrong block (scale != 1): one flag set
    nbytes = sum(q.numel() for q, _ in pairs)

    def screen():
        return torch.stack([f.reshape(()) for f in zero_block_flags(pairs, (128, 128))]).cpu()
    # blocks of a block row a program screens (harness.formats.zero_blocks.BLOCKS_PER_PROGRAM): the same flags
    from fp8check.harness.formats import zero_blocks as zbm
    want = screen()
    default, sweep = _sweep_blocks(zbm, (1, 4, 8, 16, 32), lambda: {
        "same": torch.equal(screen(), want) and int(want.sum()) == 1, "seconds": _best(screen)})
    zb = sweep[default]["seconds"]
    out["zero_blocks"] = {"bytes": nbytes, "seconds": zb, "GBps": nbytes / zb / 1e9,
                          "over_copy_rate": nbytes / zb / 1e9 / rate if rate else None,
                          "blocks_per_program": {"default": default, **{str(g): v for g, v in sweep.items()}}}
    print(f"zero-blk  {len(pairs)} FP8 weights, {nbytes / 1e9:.2f} GB: {zb * 1e3:.2f} ms = {nbytes / zb / 1e9:.0f} GB/s = "
          f"{nbytes / zb / 1e9 / (rate or 1):.2f} of the copy rate [bound: the blocks' first row read (the rest where "
          f"that row is all zero), one launch, one host copy: host- and latency-bound, not HBM-bound]")
    print("zero-blk  blocks of a row a program screens: " + ", ".join(
        f"{g}{' [default]' if g == default else ''} {v['seconds'] * 1e3:.2f} ms{'' if v['same'] else ' DIFFERENT FLAGS'}"
        for g, v in sweep.items()))


def _share(r: dict) -> dict:
    """The catalog's cost beside the sync's: capture + S1's poison (+ S7's re-sync where it ran) + checks over export
    + install (the wire -- payload, digests, buckets, receive -- is printed apart: a job's own transport has one)."""
    sync = r["export"] + r["install"]
    check = r["capture"] + r.get("poison", 0.0) + r.get("resync", 0.0) + r.get("checks", 0.0)
    return {"sync_s": sync, "catalog_s": check, "fraction": check / sync if sync else None}


def _breakdown(r: dict, top: int = 5) -> str:
    parts = [f"{k.removeprefix('capture.')} {v * 1e3:.1f}" for k, v in r.items() if k.startswith("capture.")]
    checks = sorted(((v, k.removeprefix("check.")) for k, v in r.items() if k.startswith("check.")), reverse=True)
    return (f"capture [{', '.join(parts)}] ms; poison {r.get('poison', 0) * 1e3:.1f} ms; garbage collection in the "
            f"checks {r.get('checks.gc', 0) * 1e3:.1f} ms; waiting for S3's screens begun beside the install "
            f"{r.get('checks.screens_wait', 0) * 1e3:.1f} ms; resync "
            f"{r.get('resync', 0) * 1e3:.1f} ms; wire {r.get('wire', 0) * 1e3:.1f} ms; slowest checks "
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


MODES = {   # name -> (checks_every, resync, catalog): the full catalog on every sync, then checks left on for a run
    "full": (1, True, True),
    "full_without_resync": (1, False, True),
    "per_sync": (10 ** 9, True, True),   # a schedule's cheap syncs: S7's re-sync, P1 and C1 on the periodic ones only
    # the sync alone (no poison, record, capture or checks): what the catalog adds to a sync's wall time is measured
    # against it -- the parts above overlap (the expected digests run during the install, S1's poison during the
    # wire), so a slower install or wire beside them would not show in the catalog's own parts
    "bare": (1, False, False),
}


def bench_sync(model: str, layers: int | None, steps: int, out: dict, modes=tuple(MODES), profile: int = 0):
    """K clean syncs per mode (`MODES`), the modes taking turns: the whole catalog with S7's re-sync, without it,
    the per-sync tier a run leaves on (LiveSession(checks_every=N)'s syncs between the periodic ones), the sync
    alone; best of K after the first, walls as medians."""
    from dataclasses import replace
    from fp8check.e2e.live import LiveSession
    from fp8check.harness.config import recommended_config
    from fp8check.harness.models import get_model, with_layers
    depth = get_model(model).num_layers
    name = with_layers(model, None if layers is None else min(layers, depth))   # --layers cuts deeper models only
    cfg = recommended_config(name, "blockwise-fp32")
    cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    t0 = time.perf_counter()
    rows = {m: [] for m in modes}
    profiled = None
    with LiveSession(cfg, device=True, num_gpus=0.1, rollout_kwargs={"gpu_memory_utilization": 0.3}) as s:
        start = time.perf_counter() - t0
        # the session's warm-up sync (LiveSession(warm=), on by default on the device path): the first sync
        # measured below is then a run's first sync
        warm = s.warmup.seconds if s.warmup is not None else None
        frozen = s.frozen_objects
        # the modes interleaved, sync by sync: mode after mode had set the per-sync tier's wall against a sync
        # alone measured minutes apart (call 35: export and wire slower by tens of ms in the later mode)
        for i in range(steps):
            for mode in modes:
                s.checks_every, resync, catalog = MODES[mode]
                s.step()
                t = time.perf_counter()
                o = s.sync(f"bench {mode} {i}", resync=resync, catalog=catalog)
                wall = time.perf_counter() - t
                rows[mode].append({"wall": wall, **o.seconds, "fired": o.fired, "unknown": o.unknown,
                                   "fetched": o.fetched, "params": o.params, "deferred": o.extra.get("deferred"),
                                   "payload_bytes": o.extra.get("payload_bytes")})
        if profile:     # one more sync of the last mode, under cProfile in the trainer's process (not measured)
            s.step()
            s.profile = profile
            o = s.sync("bench profile")
            s.profile = 0
            profiled = o.extra.get("profile")
    rate = _copy_rate()
    res = {"engine_start_seconds": start, "steps": rows, "copy_GBps": rate, "profile": profiled,
           "warmup": warm, "frozen_objects": frozen}
    report_sync(name, rows, rate, res)
    out.setdefault("sync", {})[name] = res


def _median(xs: list) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def report_sync(name: str, rows: dict, rate: float | None, res: dict):
    """Print each mode's best sync beside its floors and the sync alone; the figures into `res`."""
    alone = min(rows["bare"][1:] or rows["bare"], key=lambda r: r["wall"]) if rows.get("bare") else None
    if alone is not None:
        res["bare"] = {"best": alone}
        print(f"sync      {name} (the sync alone): wall {alone['wall']:.3f} s: export {alone['export']:.3f} s, wire "
              f"{alone['wire']:.3f} s, install {alone['install']:.3f} s (the trainer's RPC and the pipeline's own "
              f"work the rest); best of {len(rows['bare'][1:] or rows['bare'])}")
    for mode, rs in rows.items():
        if mode == "bare":
            continue
        # like with like: a per-sync mode's schedule makes its first sync a periodic one (the full catalog)
        tier = [r for r in rs if bool(r.get("deferred")) == (MODES[mode][0] > 1)] or rs
        best = min(tier[1:] or tier, key=lambda r: r["wall"])
        first = tier[0]
        nbytes = best["payload_bytes"] or 0
        gb = nbytes / 1e9
        sh, fsh = _share(best), _share(first)
        mem = best.get("check_extra_peak_bytes", 0)
        res[mode] = {"best": best, "payload_GB": gb, "install_GBps": gb / best["install"] if best["install"] else None,
                     "catalog_fraction_of_sync": sh["fraction"], "first_sync_catalog_fraction": fsh["fraction"],
                     "extra_peak_fraction_of_payload": mem / nbytes if nbytes else None,
                     "engine_digest_GBps": gb / best["capture.engine_digests"]
                     if best.get("capture.engine_digests") else None}
        print(f"sync      {name} ({mode.replace('_', ' ')}): payload {gb:.2f} GB in {best['params']} parameters; "
              f"export {best['export']:.3f} s, install {best['install']:.3f} s ({res[mode]['install_GBps'] or 0:.1f} "
              f"GB/s), capture {best['capture']:.4f} s, re-sync {best.get('resync', 0):.3f} s, checks "
              f"{best.get('checks', 0):.4f} s; catalog = {sh['fraction']:.1%} of the sync (target 10 %; first such sync "
              f"{fsh['fraction']:.1%}); extra peak {mem / 2**20:.0f} MiB = "
              f"{res[mode]['extra_peak_fraction_of_payload'] or 0:.1%} of the payload (target 5 %); fired "
              f"{best['fired']} unknown {best['unknown']} deferred {best.get('deferred')}")
        if rate:    # reading the payload once on each side at the copy rate: what a digest-first catalog needs
            floor = 2 * nbytes / 1e9 / rate
            res[mode]["floor_seconds"] = floor
            res[mode]["capture_over_floor"] = best["capture"] / floor if floor else None
            res[mode]["catalog_over_floor"] = sh["catalog_s"] / floor if floor else None
            print(f"          floor (the payload read once per side at {rate:.0f} GB/s): {floor * 1e3:.2f} ms; "
                  f"capture x{best['capture'] / floor:.1f} of it, catalog x{sh['catalog_s'] / floor:.1f}; engine "
                  f"digests {res[mode]['engine_digest_GBps'] or 0:.0f} GB/s = "
                  f"{(res[mode]['engine_digest_GBps'] or 0) / rate:.2f} of the copy rate (RPC included)")
        if alone is not None:   # what the catalog adds to the sync's wall, overlap and contention included
            mine = [r["wall"] for r in (tier[1:] or tier)]
            theirs = [r["wall"] for r in (rows["bare"][1:] or rows["bare"])]
            added = _median(mine) - _median(theirs)
            base = _median([r["export"] + r["install"] for r in (rows["bare"][1:] or rows["bare"])])
            res[mode]["wall_added_seconds"] = added
            res[mode]["wall_added_fraction_of_sync"] = added / base if base else None
            print(f"          wall {_median(mine):.3f} s ({min(mine):.3f}-{max(mine):.3f}) against the sync alone's "
                  f"{_median(theirs):.3f} s ({min(theirs):.3f}-{max(theirs):.3f}), medians: the catalog adds "
                  f"{added * 1e3:.1f} ms = {added / base if base else 0:.1%} of the sync alone's export + install "
                  f"(export, wire and install vary by tens of ms from sync to sync: few samples do not settle it)")
        each = tier                    # the target is every sync's, not the best one's
        res[mode]["catalog_fractions"] = [_share(r)["fraction"] for r in each]
        print(f"          each sync: " + ", ".join(
            f"{_share(r)['fraction']:.1%} (checks {r.get('checks', 0) * 1e3:.1f} ms, of it garbage collection "
            f"{r.get('checks.gc', 0) * 1e3:.1f})" for r in each)
            + f"; objects frozen after the warm-up (gc.freeze): {res.get('frozen_objects')}")
        print(f"          {_breakdown(best)}; extra peak: capture {best.get('capture_extra_peak_bytes', 0) / 2**20:.0f} "
              f"MiB, checks {best.get('checks_extra_peak_bytes', 0) / 2**20:.0f} MiB")
    print("          [bounds: install = vLLM's layerwise reload reading IPC-mapped buckets; re-sync = one more "
          "install; capture = digests (one HBM read per side) + an RPC + per-tensor Python; floor: reading the "
          "payload once per side at the measured copy rate]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--digest", action="store_true", help="the digest and zero-block screen figures alone")
    ap.add_argument("--sync", action="append", default=[])
    ap.add_argument("--layers", type=int, help="cut models deeper than this to this many layers")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default="full,full_without_resync,bare,per_sync",
                    help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--profile", type=int, default=0,
                    help="after the measured syncs, one more of the last mode under cProfile: its top N functions")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {"time": time.time()}
    try:
        if a.quantize:
            from bench.gpu_quantize import bench_quantizers
            out["quantize"] = bench_quantizers(a.out + ".quantize.json")
            bench_digest(out)
        elif a.digest:
            bench_digest(out)
        for m in a.sync:
            try:
                bench_sync(m, a.layers, a.steps, out, tuple(a.modes.split(",")), a.profile)
            except Exception as e:  # noqa: BLE001 - report and go on to the next model
                out.setdefault("errors", {})[m] = f"{e.__class__.__name__}: {e}"
                print(f"sync      {m}: FAILED {e.__class__.__name__}: {e}")
    finally:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
