"""`fp8check bench`: the benchmarks (bench/ in the source tree): CPU figures by default, the H200 figures with
--gpu. Prints what bounds each figure and writes JSON; asserts nothing (speed targets live here, not in tests)."""
from __future__ import annotations


def run(args) -> int:
    from ..errors import UsageError
    from .args import out_file
    out_file(args.out, "--out")
    try:
        if args.gpu:
            import sys
            from bench import gpu_bench
            argv = ["gpu_bench", "--out", args.out or "fp8check-bench-gpu.json", "--quantize"]
            for m in args.sync or []:
                argv += ["--sync", m]
            if args.layers:
                argv += ["--layers", str(args.layers)]
            sys.argv = argv
            gpu_bench.main()
            return 0
        from bench import bench as cpu_bench
    except ImportError as e:
        raise UsageError(f"bench needs fp8check's source tree (bench/ beside harness/) and, with --gpu, the GPU stack "
                         f"({e.name} missing)") from None
    cpu_bench.run(args.quick, args.workers, args.out)
    return 0


def register(sub, count):
    p = sub.add_parser("bench", help="benchmarks: quantizers, digests, sync + catalog, the fault matrix (CPU); the "
                       "H200 figures with --gpu")
    p.add_argument("--gpu", action="store_true", help="quantizers and the device sync path on the GPU")
    p.add_argument("--sync", action="append", metavar="MODEL", help="(--gpu) models for the sync benchmark")
    p.add_argument("--layers", type=count(1), help="(--gpu) cut the sync models to N layers")
    p.add_argument("--quick", action="store_true", help="(CPU) skip the full fault matrix")
    p.add_argument("--workers", type=count(1))
    p.add_argument("--out", metavar="FILE", help="write the figures as JSON")
    p.set_defaults(fn=run)
