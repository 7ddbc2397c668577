"""`fp8check faults`: the CPU fault-injection matrix as a table, JSON or JUnit XML."""
from __future__ import annotations

import json
import os
import time

from rich.markup import escape

from ..errors import did_you_mean
from ..formats import RECIPES
from ..models import ModelError, get_model, with_layers
from .report import console, junit_xml, print_rows

VERDICT_STYLE = {"caught": "green", "pass": "green", "n/a": "dim", "no-target": "dim", "missed": "bold red",
                 "partial": "bold red",
                 "false-alarm": "bold red",
                 "error": "bold red"}


def _count(minimum):
    from .args import count
    return count(minimum)


def run(args) -> int:
    from fp8check import faults as fault_pkg
    from fp8check.faults.matrix import SKIPPED, run_matrix, summary
    from ..errors import UsageError
    from .args import out_file
    out_file(args.junit, "--junit")
    models = None
    if args.model or args.layers is not None:
        from fp8check.faults.matrix import TINY_MODELS
        try:
            models = [with_layers(m, args.layers) for m in (args.model or TINY_MODELS)]
        except ModelError as e:
            raise UsageError(f"--model: {e}") from None
        for m in models:
            get_model(m).require_modelled()
    for r in args.recipe or []:
        if r not in RECIPES:
            raise UsageError(f"--recipe {r}: unknown recipe{did_you_mean(r, RECIPES)}; choose from {', '.join(RECIPES)}")
    for f in args.fault or []:
        if f not in fault_pkg.FAULTS:
            raise UsageError(f"--fault {f}: unknown fault{did_you_mean(f, fault_pkg.FAULTS)}; `fp8check faults --list` "
                                 f"shows them")
    if args.list:
        from ..config import recommended_config
        from ..engines.registry import get_engine
        # "live": injectable into running Megatron/TE + vLLM engines of this model and recipe (`fp8check live`)
        cfg = recommended_config((models or ["tiny-dense"])[0], (args.recipe or ["blockwise-fp32"])[0])
        knobs = get_engine("rollout", "vllm").factory.knobs
        rows = [{"fault": f.name, "family": f.family, "stage": f.stage, "trips": list(f.trips), "may": list(f.may),
                 "silent": f.silent,
                 "live": f.live_injectable(cfg, knobs), "description": f.description}
                for f in fault_pkg.FAULTS.values()]
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        # a fault name is never cut (it is what --fault takes): print_rows keeps every word of a cell whole
        print_rows(console(), f"fp8check faults ('live': injectable into running engines, {cfg.model}, "
                              f"{cfg.recipe.name})",
                   ("fault", "family", "stage", "must all fire", "may fire", "silent", "live", "what"),
                   [[escape(r["fault"]), r["family"], r["stage"], ", ".join(r["trips"]), ", ".join(r["may"]),
                     "yes" if r["silent"] else "", "yes" if r["live"] else "", escape(r["description"])]
                    for r in rows], head=("fault", "family", "stage", "silent", "live"))
        return 0
    from fp8check.faults.matrix import available_memory, cell_bytes, largest_model, memory_workers
    fit = memory_workers(models)
    if fit == 0:        # refuse up front: the kernel's OOM killer would end the run hours in, with no report
        raise UsageError(
            f"--model: one matrix cell of {largest_model(models)} "
            f"needs about {cell_bytes(models) / 2**30:.0f} GiB of host memory, {available_memory() / 2**30:.0f} GiB "
            f"are available; use fewer --layers, a config.json with a smaller vocabulary, or a larger machine")
    workers = args.workers or min(len(os.sched_getaffinity(0)), 8, fit or 8)
    t0 = time.perf_counter()
    cells = _run_with_progress(args, models, workers, run_matrix)
    wall = time.perf_counter() - t0
    s = summary(cells)
    s["seconds"] = round(wall, 1)
    s["workers"] = workers
    if args.json:
        print(json.dumps({"summary": s, "cells": [c.to_json() for c in cells]}, indent=1))
    else:
        con = console()
        print_rows(con, "fp8check fault-injection matrix (CPU reference)",
                   ("fault", "model", "recipe", "must all fire", "fired", "verdict"),
                   [[c.fault or "(clean)", c.model, c.recipe, ", ".join(c.expected) or "nothing",
                     ", ".join(c.fired) + (f" ?{', ?'.join(c.unknown)}" if c.unknown else "")
                     + (f" !{', !'.join(c.undeclared)}" if c.undeclared else ""),
                     f"[{VERDICT_STYLE.get(c.verdict, '')}]{c.verdict}[/]"
                     + (escape(f" ({c.detail[:60]})") if c.verdict in ("error", "no-target") else "")]
                    for c in cells if args.all or c.verdict not in SKIPPED],
                   head=("fault", "model", "recipe", "verdict"))
        if any(c.unknown or c.undeclared for c in cells):
            con.print("[dim]fired: invariants that failed; ?X: X could not decide (unknown, never counted as a "
                      "pass); !X: X fired although the fault does not declare it (must or may)[/]", soft_wrap=True)
        for c in cells:
            if c.verdict == "partial":
                con.print(f"[bold red]partial[/]: {c.fault} on {c.model}/{c.recipe}: must fire "
                          f"{','.join(c.expected)}, fired {','.join(c.fired) or 'nothing'}", soft_wrap=True)
        ok = "[green]OK[/]" if s["ok"] else "[bold red]FAILED[/]"
        con.print(f"{ok}: {s['caught']} faults caught (every must-fire invariant fired), {s['partial']} partial, "
                  f"{s['missed']} missed, {s['clean_pass']} clean runs pass, "
                  f"{s['false_alarms']} false alarms, {s['errors']} errors; {s['applicable']} applicable of "
                  f"{s['cells']} cells ({s['not_applicable']} n/a, {s['no_target']} no target) in {wall:.1f} s on "
                  f"{workers} worker(s)", soft_wrap=True)
    if args.junit:
        cases = [(f"faults.{c.model}.{c.recipe}", c.fault or "clean",
                  "pass" if c.ok else ("unknown" if c.verdict == "error" else "fail"),
                  f"{c.verdict}: expected {list(c.expected)}, fired {c.fired} {c.detail}") for c in cells
                 if c.verdict not in SKIPPED]
        with open(args.junit, "w") as fh:
            fh.write(junit_xml("fp8check faults", cases))
    return 0 if s["ok"] else 1


def _run_with_progress(args, models, workers, run_matrix):
    """A progress bar on a terminal (the matrix takes tens of seconds); nothing extra when piped or with --json."""
    import sys
    if args.json or not sys.stderr.isatty():
        return run_matrix(models, args.recipe, args.fault, workers=workers)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("fault matrix"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("cells", total=None)

        def tick(done, total):
            bar.update(task, completed=done, total=total)
        return run_matrix(models, args.recipe, args.fault, workers=workers, progress=tick)


def register(sub):
    p = sub.add_parser("faults", help="run the CPU fault-injection matrix")
    from .args import LAYERS_HELP, MODEL_HELP
    p.add_argument("--model", action="append", help=MODEL_HELP + " (repeatable; default the tiny models)")
    p.add_argument("--layers", type=int, metavar="N", help=LAYERS_HELP)
    p.add_argument("--recipe", action="append", help="recipe (repeatable; default all)")
    p.add_argument("--fault", action="append", help="only this fault (repeatable; default all)")
    p.add_argument("--workers", type=_count(1), help="processes (default: CPU count, at most 8, and as many cells "
                   "as fit in the available memory: a 1-layer Qwen3-8B cell needs about 14 GB)")
    p.add_argument("--all", action="store_true", help="also list cells where a fault does not apply (n/a) or its "
                                                      "injector found nothing to corrupt (no target)")
    p.add_argument("--list", action="store_true", help="list the faults and exit")
    p.add_argument("--json", action="store_true")
    p.add_argument("--junit", metavar="FILE")
    p.set_defaults(fn=run)
