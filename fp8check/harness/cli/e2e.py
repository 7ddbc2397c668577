"""`fp8check e2e`: the end-to-end RL comparison (e2e/rl): a GRPO loop per arm and seed with a checked weight sync
after every step, per-step metrics (steps.jsonl), paired statistics over seeds, a PNG per metric, report.md /
report.html / summary.json. CPU by default; `--engine live` runs the same loop on the registered GPU engines
(Megatron-Core/TE + vLLM), which must implement the RL methods (e2e/rl/engines.py). Exit 0 when every claim
holds (e2e/rl/claims.py, tolerances fixed before the run), 1 when one is violated, 2 on bad input.

Without flags: on-policy FP8 beside three off-policy configurations (DEFAULT_ARMS), 3 seeds x 30 RL steps on the CPU
engines, whose claims hold at tiny-rl's scale; `--arms full --seeds 5 --steps 60` adds naive-fp8 and bf16, whose
two claims that scale leaves violated (exit 1, the report says why from the run's own records)."""
from __future__ import annotations

import json
import os
import sys
import time

from rich.table import Table

from ..formats import RECIPES
from ..models import MODELS
from .report import console

CLAIM_STYLE = {"holds": "green", "violated": "bold red", "unknown": "yellow", "not run": "dim"}


def _arms(text: str) -> list[str]:
    from fp8check.e2e.rl.arms import ARMS, FULL_ARMS
    from ..errors import UsageError
    if text.strip() == "full":
        return list(FULL_ARMS)
    arms = [a.strip() for a in text.split(",") if a.strip()]
    for a in arms:
        if a not in ARMS:
            raise UsageError(f"--arms {a}: unknown arm; choose from {', '.join(ARMS)}")
    if not arms or len(set(arms)) != len(arms):
        raise UsageError(f"--arms {text!r}: a comma-separated list of distinct arms ({', '.join(ARMS)})")
    return arms


def read_part(path: str) -> tuple[list, list]:
    """(runs, steps) of one earlier `fp8check e2e --out` directory."""
    from ..errors import UsageError
    out = []
    for name in ("runs.jsonl", "steps.jsonl"):
        f = os.path.join(path, name)
        try:
            with open(f) as fh:
                out.append([json.loads(line) for line in fh if line.strip()])
        except FileNotFoundError:
            raise UsageError(f"--merge {path}: no {name} (a directory an `fp8check e2e --out` run wrote)") from None
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"--merge {f}: cannot read it ({e.__class__.__name__}: {e})") from None
    return out[0], out[1]


def merge_parts(paths: list[str]) -> tuple[list, list, dict]:
    """Parts of one comparison (one arm or seed each) merged: (runs, steps, the settings they share). Parts that
    ran other settings, or the same (arm, seed) twice, are an error naming the part."""
    from ..errors import UsageError
    runs, steps, settings, seen = [], [], None, {}
    for p in paths:
        r, st = read_part(p)
        for h in r:
            key = (h["arm"], h["seed"])
            if key in seen:
                raise UsageError(f"--merge {p}: arm {key[0]} seed {key[1]} is also in {seen[key]}")
            seen[key] = p
            if settings is None:
                settings = h["settings"]
            elif h["settings"] != settings:
                diff = sorted(k for k in settings if settings.get(k) != h["settings"].get(k))
                raise UsageError(f"--merge {p}: ran other settings ({', '.join(diff)}) than the first part")
        runs += r
        steps += st
    if not runs:
        raise UsageError(f"--merge {' '.join(paths)}: the parts hold no runs")
    return runs, steps, settings


def run(args) -> int:
    from fp8check.e2e.rl.claims import Tolerances, evaluate
    from fp8check.e2e.rl.engines import missing_rl_surface, unsupported
    from fp8check.e2e.rl.loop import LoopSettings, run_comparison
    from fp8check.e2e.rl.plots import MissingMatplotlib, require_matplotlib, write_plots
    from fp8check.e2e.rl.report import write_report
    from fp8check.e2e.rl.task import DIGIT0, DigitTask
    from ..snapshot import prepare_out_dir
    from ..errors import UsageError
    arms = _arms(args.arms)
    for flag, v, lo in (("--steps", args.steps, 1), ("--seeds", args.seeds, 1), ("--seed-start", args.seed_start, 0),
                        ("--prompts", args.prompts, 1),
                        ("--group", args.group, 2), ("--length", args.length, 1), ("--warmup", args.warmup, 0)):
        if v < lo:
            raise UsageError(f"{flag} {v}: must be >= {lo}")
    for flag, v in (("--clip-low", args.clip_low), ("--clip-high", args.clip_high), ("--lr", args.lr)):
        if not v > 0:
            raise UsageError(f"{flag} {v}: must be > 0")
    if args.clip_low >= 1:
        raise UsageError(f"--clip-low {args.clip_low}: must be < 1 (the lower ratio bound is 1 - clip-low)")
    if args.temperature <= 0:
        raise UsageError(f"--temperature {args.temperature}: must be > 0 (the ratio needs a sampling distribution)")
    try:
        DigitTask(args.task, args.length)
    except ValueError as e:
        raise UsageError(f"--task: {e}") from None
    if MODELS[args.model].vocab_size < DIGIT0 + 10:
        raise UsageError(f"--model {args.model}: vocabulary {MODELS[args.model].vocab_size} is too small for the digit "
                         f"task (needs {DIGIT0 + 10} tokens)")
    if not args.no_plots:
        try:
            require_matplotlib()
        except MissingMatplotlib as e:
            raise UsageError(str(e)) from None
    if args.engine == "live":
        from .args import require_gpu_stack
        require_gpu_stack("--engine live", "the default --engine cpu runs the same loop on the CPU engines")
        missing = missing_rl_surface("live")
        if missing:
            raise UsageError(f"--engine live: the registered GPU engines lack {', '.join(missing)} (the RL methods "
                             f"e2e/rl/engines.py defines); implement them or use --engine cpu")
    if args.merge:
        return _merge(args)
    from fp8check.e2e.rl.arms import ARMS, arm_config
    from ..config import ConfigError, recommended_config
    for a in arms:                    # every arm's config is valid before any run starts (a worker would fail late)
        try:
            cfg = arm_config(ARMS[a], recommended_config(args.model, args.recipe))
        except ConfigError as e:
            raise UsageError(f"--arms {a} with --recipe {args.recipe}: {e}") from None
        off = unsupported(cfg, args.engine)
        if off:
            raise UsageError(f"--arms {a} with --engine {args.engine}: the {'; the '.join(off)}")
    prepare_out_dir(args.out)
    settings = LoopSettings(model=args.model, recipe=args.recipe, task=args.task, length=args.length,
                            prompts_per_step=args.prompts, group_size=args.group, temperature=args.temperature,
                            lr=args.lr, warmup_steps=args.warmup, eps_low=args.clip_low, eps_high=args.clip_high,
                            scale_advantages=not args.no_std, engines=args.engine)
    jobs = args.jobs or min(len(os.sched_getaffinity(0)), len(arms) * args.seeds)
    if args.engine == "live":
        jobs = 1                      # one GPU: the runs share it one after another
    t0 = time.perf_counter()

    def progress(run_header):
        print(f"  {run_header['arm']} seed {run_header['seed']}: {run_header['steps']} steps in "
              f"{run_header['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
    res = run_comparison(arms, args.seeds, args.steps, settings, out=args.out, jobs=jobs, progress=progress,
                         seed_start=args.seed_start)
    tol = Tolerances()
    claims = evaluate(res["runs"], res["steps"], tol)
    meta = {"command": "fp8check " + " ".join(args.argv), "settings": settings.to_dict(), "arms": arms,
            "steps": args.steps, "seeds": args.seeds, "jobs": jobs, "tolerances": tol.to_dict(),
            "wall_seconds": round(time.perf_counter() - t0, 1), "cpu_count": os.cpu_count()}
    if not args.no_plots:
        meta["figures"] = write_plots(res["steps"], args.out, tol.to_dict())
    summary = write_report(args.out, res["runs"], res["steps"], claims, meta)
    return _print(args, arms, claims, summary, meta)


def _merge(args) -> int:
    """`--merge DIR ...`: one report from parts run separately (one arm or seed each, e.g. live runs that must each
    fit a 10-minute device call)."""
    from fp8check.e2e.rl.claims import Tolerances, evaluate
    from fp8check.e2e.rl.loop import write_records
    from fp8check.e2e.rl.plots import write_plots
    from fp8check.e2e.rl.report import write_report
    from ..snapshot import prepare_out_dir
    runs, steps, settings = merge_parts(args.merge)
    prepare_out_dir(args.out)
    write_records(args.out, runs, steps)
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    tol = Tolerances()
    claims = evaluate(runs, steps, tol)
    seeds = sorted({r["seed"] for r in runs})
    meta = {"command": "fp8check " + " ".join(args.argv), "settings": settings, "arms": arms,
            "steps": max(r["steps"] for r in runs), "seeds": len(seeds), "jobs": None, "tolerances": tol.to_dict(),
            "merged_from": list(args.merge), "wall_seconds": round(sum(r.get("wall_seconds", 0) for r in runs), 1),
            "cpu_count": os.cpu_count()}
    if not args.no_plots:
        meta["figures"] = write_plots(steps, args.out, tol.to_dict())
    summary = write_report(args.out, runs, steps, claims, meta)
    return _print(args, arms, claims, summary, meta)


def _print(args, arms, claims, summary, meta) -> int:
    if args.json:
        from fp8check.e2e.rl.loop import jsonable
        print(json.dumps(jsonable(summary), indent=1, allow_nan=False))
    else:
        t = Table(title=f"fp8check e2e: {', '.join(arms)}; {meta['seeds']} seed(s) x {meta['steps']} steps "
                        f"({meta['wall_seconds']:.0f} s)")
        for c in ("claim", "verdict", "detail"):
            t.add_column(c, overflow="fold")
        for c in claims:
            t.add_row(c["claim"], f"[{CLAIM_STYLE[c['verdict']]}]{c['verdict']}[/]", c["detail"])
        con = console()
        con.print(t)
        # the figures per arm too: a part of a split run whose files do not come back still leaves its numbers
        per = summary.get("per_arm", {})
        keys = [k for k in ("mean_abs_dlogprob", "kl", "ratio_mean", "ratio_p05", "entropy", "reward") if k in per]
        f = Table(title="per arm: mean over steps, then over seeds [95% interval]")
        for c in ["arm"] + keys:
            f.add_column(c, overflow="fold")
        for a in arms:
            cells = []
            for k in keys:
                m = per[k].get(a) or {}
                v, lo, hi = m.get("mean"), m.get("low"), m.get("high")
                interval = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
                cells.append("-" if v is None else f"{v:.4g}{interval}")
            f.add_row(a, *cells)
        con.print(f)
        con.print(f"{'FAILED: ' + ', '.join(summary['failed']) if summary['failed'] else 'OK'}; "
                  f"records, figures and report in {args.out}/ (report.md, report.html, steps.jsonl)")
    return 1 if summary["failed"] else 0


DEFAULT_STEPS, DEFAULT_SEEDS = 30, 3     # the default run: short, and its claims hold on the CPU engines
HELP = "end-to-end RL comparison: the field's FP8 configurations vs on-policy FP8 (GRPO, checked syncs)"


def register(sub, selected: bool = True):
    """The e2e arguments take their defaults from the RL loop, which imports torch: when another command runs, only
    the help line is registered (pre-flight must not pay for torch)."""
    if not selected:
        sub.add_parser("e2e", help=HELP)
        return
    from fp8check.e2e.rl.arms import ARMS, DEFAULT_ARMS, FULL_ARMS
    from fp8check.e2e.rl.loop import LoopSettings
    from fp8check.e2e.rl.task import TASKS
    d = LoopSettings()
    p = sub.add_parser("e2e", help=HELP)
    p.add_argument("--model", choices=sorted(MODELS), default=d.model)
    p.add_argument("--recipe", choices=sorted(RECIPES), default=d.recipe)
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated arms of {', '.join(ARMS)}, or 'full' ({','.join(FULL_ARMS)}) "
                        f"(default: {','.join(DEFAULT_ARMS)})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="RL steps per run")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="independent seeds (K..K+N-1); arms are paired within a seed")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (a part of a split run: --merge joins them)")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="merge parts (earlier --out directories) into one report in --out; runs nothing")
    p.add_argument("--task", choices=TASKS, default=d.task)
    p.add_argument("--length", type=int, default=d.length, help="digits per prompt")
    p.add_argument("--prompts", type=int, default=d.prompts_per_step, help="prompts per step")
    p.add_argument("--group", type=int, default=d.group_size, help="completions per prompt (GRPO group)")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    p.add_argument("--warmup", type=int, default=d.warmup_steps, help="supervised warm-up steps before RL")
    p.add_argument("--clip-low", type=float, default=d.eps_low, help="PPO eps_low (lower ratio bound 1 - eps_low)")
    p.add_argument("--clip-high", type=float, default=d.eps_high, help="PPO eps_high (DAPO: 0.28)")
    p.add_argument("--no-std", action="store_true", help="advantages without the group std (Dr. GRPO)")
    p.add_argument("--engine", choices=["cpu", "live"], default="cpu")
    p.add_argument("--jobs", type=int, help="worker processes (default: one per core, at most one per run)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--json", action="store_true", help="print summary.json")
    p.set_defaults(fn=run, argv=None)
