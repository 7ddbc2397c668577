"""`fp8check live` (GPU): real Megatron-Core/TE trainer + real vLLM, checked syncs, probes, live faults."""
from __future__ import annotations

import json
import os
import tempfile

from ..models import LIVE_ARCHITECTURES
from .report import console, print_rows


DEVICE_PATH_PARAMS = 200_000_000      # above this the weights travel GPU to GPU by default (--device-path auto)
DEVICE_TRAINERS = ("megatron", "cpu-reference")     # trainers whose export can stay on the GPU (trainer.device)


def _count(minimum):
    from .args import count
    return count(minimum)


def run(args) -> int:
    from ..errors import UsageError
    from .args import build_config, out_file, require_gpu_stack
    out_file(args.out, "--out")
    config = build_config(args)
    if not config.spec.live:
        raise UsageError(f"--model {config.model}: CPU reference only (live: the tiny models and "
                         f"{', '.join(LIVE_ARCHITECTURES)} configs without unmodelled features)")
    if args.trainer == "megatron" and "linear_attention" in config.spec.layer_types:
        raise UsageError(f"--model {config.model}: the Megatron/TE trainer adapter does not build gated delta-net "
                         f"layers; use --trainer cpu-reference (fp8check's TE-exact learner, on the GPU on the "
                         f"device path)")
    require_gpu_stack("live", "use `fp8check faults` / `snapshot` on CPU")
    if config.calibrated_kv:
        from ..engines.vllm import CALIBRATED_KV_UNSUPPORTED
        raise UsageError(f"--set {CALIBRATED_KV_UNSUPPORTED}")
    from fp8check.faults import FAULTS, live_faults, real_shape_faults
    from fp8check.e2e.live import run_live
    from ..engines.registry import get_engine
    if args.faults == ["all"]:
        names = live_faults(config, get_engine("rollout", "vllm").factory.knobs)
    elif args.faults == ["real-shape"]:
        try:
            names = list(real_shape_faults(config.spec.name))
        except LookupError as e:
            raise UsageError(f"--faults real-shape: {e}") from None
    else:
        names = args.faults or []
    for n in names:
        if n not in FAULTS:
            from ..errors import did_you_mean
            raise UsageError(f"--faults {n}: unknown fault{did_you_mean(n, FAULTS)}; `fp8check faults --list` shows them")
    workdir = args.workdir or tempfile.mkdtemp(prefix="fp8check-live-")
    if args.snapshot:
        from ..snapshot import prepare_out_dir
        prepare_out_dir(args.snapshot, "--snapshot")
    device = args.device_path == "on" or (args.device_path == "auto" and config.spec.num_params() > DEVICE_PATH_PARAMS)
    if device and args.trainer not in DEVICE_TRAINERS:
        raise UsageError(f"--device-path needs a trainer whose FP8 export stays on the GPU: "
                         f"{', '.join(DEVICE_TRAINERS)}")
    if device and args.snapshot:
        raise UsageError("--snapshot reads the engine state through the host path; use --device-path off")
    if device:
        from dataclasses import replace
        config = replace(config, trainer=replace(config.trainer, device=True))
    report = run_live(config, args.steps, names, probes=not args.no_probes, snapshot_dir=args.snapshot,
                      trainer=args.trainer, rollout="vllm", device=device, checks_every=args.checks_every,
                      rollout_kwargs={"workdir": workdir, "gpu_memory_utilization": args.gpu_memory_utilization})
    report["path"] = "device" if device else "host"
    return render(report, config, args, workdir)


def render(report: dict, config, args, workdir: str) -> int:
    out = args.out or os.path.join(workdir, "live.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    # a re-sync after a destructive fault that left the engine broken must say so; the engine is then replaced
    ok = all(not s["fired"] and not s["unknown"] for s in report["syncs"] if not s.get("engine_replaced")) and \
        all(f["verdict"] in ("caught", "n/a", "no target") for f in report["faults"])
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        from rich.markup import escape
        con = console()
        rows = []
        for s in report["syncs"]:
            p = s.get("probes") or {}
            rows.append([escape(s["label"]), ", ".join(s["fired"]) or "-", ", ".join(s["unknown"]) or "-",
                         f"{s['fetched_params']}/{s['params']}", f"{p['mean_abs_dlogprob']:.2e}" if p else "",
                         " ".join(f"{k}={v}" for k, v in s["seconds"].items())])
        print_rows(con, f"fp8check live: {config.model}, {config.recipe.name} (engines up in "
                        f"{report['start_seconds']} s)",
                   ("sync", "fired", "unknown", "fetched", "probe mean|dlogprob|", "seconds"), rows,
                   head=("sync", "fired", "unknown"))
        if report["faults"]:
            print_rows(con, "live fault injection", ("fault", "must trip", "fired", "verdict"),
                       [[f["fault"], ", ".join(f.get("must_trip", [])), ", ".join(f.get("fired", [])),
                         f["verdict"] + (escape(f" ({f['detail']})") if f.get("detail") else "")]
                        for f in report["faults"]], head=("fault", "verdict"))
        if report.get("snapshot"):
            con.print(report["snapshot"])
        con.print(f"{'OK' if ok else 'FAILED'}; report written to {out}")
    return 0 if ok else 1


def register(sub, cfg_args):
    p = sub.add_parser("live", help="(GPU) trainer + vLLM, checked syncs, probes and live faults")
    cfg_args(p, model_default="tiny-dense")
    p.add_argument("--steps", type=_count(0), default=2)
    p.add_argument("--faults", nargs="*", help="fault names, 'all' for every live-injectable fault, or 'real-shape' "
                   "for a shipped model's real-shape set (faults.REAL_SHAPE_FAULTS)")
    p.add_argument("--trainer", choices=["megatron", "cpu-reference"], default="megatron",
                   help="registered trainer engine (cpu-reference: fp8check's TE-exact learner mirror feeding the real "
                        "vLLM; on the device path it computes on the GPU)")
    p.add_argument("--no-probes", action="store_true")
    p.add_argument("--checks-every", type=_count(1), default=1, metavar="N",
                   help="checks left on for a run: every sync runs the catalog, and the first clean sync, every N-th "
                        "one and every fault sync also what costs as much as the sync (S7's re-sync, P1, C1)")
    p.add_argument("--device-path", choices=["auto", "on", "off"], default="auto",
                   help="weights GPU to GPU through CUDA IPC, the pipeline in the trainer's process (auto: for models "
                        "over 200 M parameters; the Megatron/TE or the cpu-reference trainer)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.12, help="vLLM's share of the GPU")
    p.add_argument("--workdir")
    p.add_argument("--out", help="JSON report path")
    p.add_argument("--snapshot", metavar="DIR", help="write the last clean sync as a snapshot directory, read "
                   "back in full from the engines (check it later with `fp8check verify DIR`)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=run)
