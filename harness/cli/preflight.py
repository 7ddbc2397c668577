"""`fp8check preflight CONFIG`: validate an RL job's FP8 config and environment before a long run."""
from __future__ import annotations

import json
import os

from ..jobconfig import Line, parse_job

# SyncConfig field a rule names -> what the user changes (resolved through the job's provenance)
FIELD_HINT = {"rollout.deep_gemm_e8m0": "rollout.deep_gemm_e8m0", "trainer.scale_format": "trainer.scale_format",
              "trainer.amax_epsilon": "trainer.amax_epsilon", "trainer.fp8_param": "trainer.fp8_param",
              "rollout.tp_size": "rollout.tp_size", "trainer.tp_size": "trainer.tp_size", "recipe": "recipe",
              "lora": "lora", "rollout.weight_block_size": "rollout.weight_block_size"}


def rule_lines(job) -> list[Line]:
    """The job rules and the config rules (C/X/A) over the job, as pre-flight lines naming the user's key."""
    from invariants import REGISTRY, CheckContext, run_catalog
    fams = ("job", "contract", "exclusion", "alignment")
    findings = run_catalog(CheckContext(job.config, job=job), families=fams, static_only=True)
    out, failing, seen = [], set(), {}
    for f in findings:
        if f.verdict == "pass":
            continue
        failing.add(f.invariant_id)
        inv = REGISTRY[f.invariant_id]
        ev = f.evidence
        if inv.scope == "job":
            key, value = ev.get("key") or "-", ev.get("value")
            src = True
        else:
            field = ev.get("key", "")
            src = job.sources.get(FIELD_HINT.get(field, field))
            key, value = (src if src else (f.tensor or field or "-", None))
        level = "warning" if f.verdict == "unknown" or inv.severity == "warning" else "error"
        group = (f.invariant_id, str(key)) if src else None
        if group in seen:                     # one line per rule and key; the rest are counted
            seen[group][1] += 1
            continue
        line = Line(level, f.invariant_id, str(key), value,
                    (f"{f.tensor}: " if f.tensor and src else "") + f.message, ev.get("fix", ""))
        out.append(line)
        if group:
            seen[group] = [line, 0]
    for line, more in seen.values():
        if more:
            line.why += f" (and {more} more tensor(s))"
    for inv in REGISTRY.values():
        if inv.family in fams and inv.scope != "sync" and inv.id not in failing:
            out.append(Line("ok", inv.id, inv.family, None, inv.title))
    return out


def probe_lines(job) -> list[Line]:
    """One live sync round trip on a tiny model with the job's recipe and engine settings."""
    try:
        import torch
        if not torch.cuda.is_available():
            return [Line("warning", "PROBE", "--probe", None, "probe skipped: no CUDA GPU visible")]
        import ray  # noqa: F401
        import vllm  # noqa: F401
        import megatron.core  # noqa: F401
    except ImportError as e:
        return [Line("warning", "PROBE", "--probe", None, f"probe skipped: {e.name} not installed (pip install '.[gpu]')")]
    import tempfile
    from dataclasses import replace
    from e2e.live import LiveSession
    cfg = replace(job.config, model="tiny-dense" if not job.config.spec.live else job.config.model)
    with LiveSession(cfg, rollout_kwargs={"workdir": tempfile.mkdtemp(prefix="fp8check-probe-")}) as s:
        s.step()
        o = s.sync("preflight probe", probes=True)
    lines = []
    for i in ("S1", "S2", "S3", "S4", "S5", "S6", "S7"):
        bad = [f for f in o.findings if f.invariant_id == i and f.verdict != "pass"]
        lines.append(Line("error" if bad else "ok", f"PROBE-{i}", cfg.model, None,
                          bad[0].message if bad else "held on a live sync round trip"))
    return lines


def run(args) -> int:
    from . import UsageError, load_yaml, parse_sets
    data = load_yaml(args.config)
    for k, v in parse_sets(args.set).items():
        data[k] = v
    if args.model is not None:
        from ..models import get_model
        get_model(args.model)                      # a model asked for by name must resolve (exit 2 if not)
        data["fp8check.model"] = args.model        # the job reader's own key for the model (first in precedence)
    env = dict(os.environ)
    for k, v in parse_sets(args.env, "--env").items():
        env[k] = "" if v is None else str(int(v) if isinstance(v, bool) else v)
    if args.gpu not in ("auto", "sm90", "sm100", "sm120"):
        raise UsageError(f"--gpu {args.gpu}: expected sm90, sm100, sm120 or auto")
    job = parse_job(data, env, args.gpu, source=args.config)
    if args.layers is not None:
        from dataclasses import replace
        from ..models import with_layers
        job.config = replace(job.config, model=with_layers(job.config.model, args.layers))
    lines = rule_lines(job)
    if args.probe:
        lines += probe_lines(job)
    errors = sum(1 for ln in lines if ln.level == "error")
    summary = {"config": args.config, "resolved": {k: list(v) for k, v in job.sources.items()},
               "model": job.config.model, "recipe": job.config.recipe.name, "sync_mode": job.config.sync_mode, "gpu_arch": job.config.gpu_arch,
               "errors": errors, "warnings": sum(1 for ln in lines if ln.level == "warning")}
    if args.json:
        print(json.dumps({**summary, "lines": [ln.to_json() for ln in lines]}, indent=1, default=str))
    else:
        from .report import STYLE, console
        c = console()
        c.print(f"fp8check preflight {args.config}: {job.config.recipe.name}, {job.config.sync_mode} sync, "
                f"{job.config.gpu_arch}, model {job.config.model}")
        for k, (src, val) in job.sources.items():
            c.print(f"  [dim]{k:24s} <- {src} = {val}[/]")
        order = {"error": 0, "warning": 1, "ok": 2}
        for ln in sorted(lines, key=lambda x: order[x.level]):
            if ln.level == "ok" and not args.verbose and not ln.rule.startswith("PROBE"):
                continue                          # a requested probe always shows what it proved
            val = "" if ln.value is None else f" = {ln.value}"
            fix = f"  fix: {ln.fix}" if ln.fix else ""
            c.print(f"[{STYLE[ln.level]}]{ln.level:7s}[/] {ln.rule:6s} {ln.key}{val}: {ln.why}{fix}", soft_wrap=True)
        oks = sum(1 for ln in lines if ln.level == "ok")
        c.print(f"{'FAILED' if errors else 'OK'}: {errors} error(s), {summary['warnings']} warning(s), {oks} rule(s) "
                f"hold{'' if args.verbose else ' (-v lists them)'}")
    return 1 if errors else 0


def register(sub):
    p = sub.add_parser("preflight", help="validate an RL job's FP8 config and environment")
    p.add_argument("config", help="job YAML (SkyRL or verl keys, nested or dotted)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="override an environment variable")
    p.add_argument("--gpu", default="auto", help="sm90 | sm100 | sm120 | auto (detect; Hopper when no GPU)")
    p.add_argument("--probe", action="store_true", help="one live sync round trip on a tiny model (GPU)")
    from . import LAYERS_HELP, MODEL_HELP
    p.add_argument("--model", metavar="MODEL", help=MODEL_HELP + " (instead of the job's model)")
    p.add_argument("--layers", type=int, metavar="N", help=LAYERS_HELP)
    p.add_argument("-v", "--verbose", action="store_true", help="also list the rules that hold")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=run)
