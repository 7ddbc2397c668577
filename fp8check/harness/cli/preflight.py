"""`fp8check preflight CONFIG`: validate an RL job's FP8 config and environment before a long run.
`fp8check preflight --explain RULE [CONFIG]`: the rule, why it exists and what to change; with a config, its
verdict there and the provenance of every value it read."""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import is_dataclass

from ..jobconfig import Line, parse_job

FAMILIES = ("job", "contract", "exclusion", "alignment")
# SyncConfig members a config rule reads -> the job.sources entries they are built from
DERIVED = {
    "recipe": ("recipe", "trainer.scale_format", "recipe.amax_epsilon"),
    "trainer_recipe": ("recipe", "trainer.scale_format", "recipe.amax_epsilon"),
    "trainer.scale_format": ("trainer.scale_format",), "trainer.amax_epsilon": ("trainer.scale_format",),
    "requant_ue8m0": ("recipe", "rollout.use_deep_gemm", "rollout.deep_gemm_e8m0"),
    "deep_gemm_e8m0": ("recipe", "rollout.deep_gemm_e8m0"),
    "rollout.use_deep_gemm": ("rollout.use_deep_gemm",), "rollout.deep_gemm_e8m0": ("rollout.deep_gemm_e8m0",),
    "arch": ("gpu_arch", "recipe"), "gpu_arch": ("gpu_arch",),
    "spec": ("model",), "model": ("model",), "layout": ("model", "rollout.tp_size"),
    "fp8_tensors": ("model", "exclude"), "ignored_layers": ("model", "exclude"), "high_precision": ("model", "exclude"),
    "exclude_patterns": ("model", "exclude"), "exclude": ("exclude",),
    "lora_adapter_only": ("lora",), "lora_rank": ("lora",), "lora_merge": ("lora",), "sync_mode": ("sync_mode",),
    "trainer.fp8_param": ("trainer.fp8_param",), "trainer.tp_size": ("trainer.tp_size",),
    "trainer.cp_size": ("trainer.cp_size",), "rollout.tp_size": ("rollout.tp_size",),
    "rollout.weight_block_size": ("rollout.weight_block_size",),
}


def _registry():
    from fp8check.invariants import REGISTRY
    return REGISTRY


def rule_lines(job) -> list[Line]:
    """The job rules and the config rules (C/X/A) over the job, as pre-flight lines naming the user's key: a rule
    that failed (error / warning), one that holds (ok), one with nothing to judge here (n/a, with why: a rule over
    another stack's keys, a condition the configuration does not have)."""
    from fp8check.invariants import CheckContext, run_catalog
    reg = _registry()
    skipped: dict = {}
    findings = run_catalog(CheckContext(job.config, job=job), families=FAMILIES, static_only=True, skipped=skipped)
    out, failing, seen = [], set(), {}
    for f in findings:
        if f.verdict == "pass":
            continue
        failing.add(f.invariant_id)
        inv = reg[f.invariant_id]
        ev = f.evidence
        if inv.scope == "job":
            key, value = ev.get("key") or "-", ev.get("value")
            src = True
        else:
            field = ev.get("key", "")
            src = job.sources.get(field)
            key, value = (src if src else (f.tensor or field or "-", None))
        level = "warning" if f.verdict == "unknown" or ev.get("severity", inv.severity) == "warning" else "error"
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
    for inv in reg.values():
        if inv.id in skipped:
            out.append(Line("n/a", inv.id, inv.family, None, f"{inv.title}: not applicable, {skipped[inv.id]}"))
        elif inv.family in FAMILIES and inv.scope in ("job", "config") and inv.id not in failing:
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
    from fp8check.e2e.live import LiveSession
    cfg = replace(job.config, model="tiny-dense" if not job.config.spec.live else job.config.model)
    device = cfg.spec.num_params() > 200_000_000     # a real shape: its weights travel GPU to GPU
    if device:
        cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    with LiveSession(cfg, device=device, rollout_kwargs={"workdir": tempfile.mkdtemp(prefix="fp8check-probe-"),
                                                         "gpu_memory_utilization": 0.25 if device else 0.12}) as s:
        s.step()
        o = s.sync("preflight probe", probes=True)
    lines = []
    for i in ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "P1"):
        mine = [f for f in o.findings if f.invariant_id == i]
        bad = [f for f in mine if f.verdict != "pass"]
        # P1: the engines' own log-probs against a bound derived from the trainer's bytes for this sync (it can fail)
        held = mine[0].message if i == "P1" and mine else "held on a live sync round trip"
        lines.append(Line("error" if bad else "ok", f"PROBE-{i}", cfg.model, None, bad[0].message if bad else held))
    return lines


def read_job(args):
    """The Job for `args.config` with --set / --env / --gpu applied."""
    from ..errors import UsageError
    from .args import load_yaml, parse_sets
    data = load_yaml(args.config)
    sets = parse_sets(args.set)
    if getattr(args, "model", None) is not None:
        from ..models import get_model
        get_model(args.model)                       # a model asked for by name must resolve (exit 2 if not)
        sets["fp8check.model"] = args.model         # the job reader's own key for the model (first in precedence)
    env, env_origin = dict(os.environ), {k: "environment" for k in os.environ}
    for item in args.env or []:             # environment values are strings, taken literally (not YAML)
        if "=" not in item:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        env[k.strip()] = v
        env_origin[k.strip()] = "--env"
    if args.gpu not in ("auto", "sm90", "sm100", "sm120"):
        raise UsageError(f"--gpu {args.gpu}: expected sm90, sm100, sm120 or auto")
    job = parse_job(data, env, args.gpu, source=args.config, sets=sets, env_origin=env_origin,
                    base_dir=os.path.dirname(os.path.abspath(args.config)))
    if getattr(args, "layers", None) is not None:
        from dataclasses import replace
        from ..models import with_layers
        job.config = replace(job.config, model=with_layers(job.config.model, args.layers))
    return job


def run(args) -> int:
    from ..errors import UsageError
    if args.explain:
        return explain(args)
    if not args.config:
        raise UsageError("preflight: give a job config (or --explain RULE)")
    job = read_job(args)
    lines = rule_lines(job)
    if args.probe:
        lines += probe_lines(job)
    errors = sum(1 for ln in lines if ln.level == "error")
    from ..jobconfig.versions import JUDGED
    summary = {"config": args.config, "stack": job.stack, "judged_against": JUDGED[job.stack],
               "resolved": {k: list(v) for k, v in job.sources.items()}, "model": job.config.model,
               "recipe": job.config.recipe.name, "sync_mode": job.config.sync_mode, "gpu_arch": job.config.gpu_arch,
               "errors": errors, "warnings": sum(1 for ln in lines if ln.level == "warning"),
               "hold": sum(1 for ln in lines if ln.level == "ok"),
               "not_applicable": sum(1 for ln in lines if ln.level == "n/a")}
    if args.json:
        print(json.dumps({**summary, "lines": [ln.to_json() for ln in lines]}, indent=1, default=str))
    else:
        from rich.markup import escape

        from .report import STYLE, console
        c = console()
        c.print(f"fp8check preflight {escape(args.config)} ({job.stack}, judged against {escape(JUDGED[job.stack])}): "
                f"{job.config.recipe.name}, {job.config.sync_mode} sync, {job.config.gpu_arch}, model {job.config.model}",
                soft_wrap=True)
        for k, (src, val) in job.sources.items():
            c.print(f"  [dim]{k:24s} <- {escape(str(src))} = {escape(str(val))}[/]", soft_wrap=True)
        order = {"error": 0, "warning": 1, "ok": 2, "n/a": 3}
        for ln in sorted(lines, key=lambda x: order[x.level]):
            if ln.level in ("ok", "n/a") and not args.verbose and not ln.rule.startswith("PROBE"):
                continue                          # a requested probe always shows what it proved
            val = "" if ln.value is None else f" = {ln.value}"
            fix = f"  fix: {ln.fix}" if ln.fix else ""
            c.print(f"[{STYLE[ln.level]}]{ln.level:7s}[/] {ln.rule:6s} " + escape(f"{ln.key}{val}: {ln.why}{fix}"),
                    soft_wrap=True)
        c.print(f"{'FAILED' if errors else 'OK'}: {errors} error(s), {summary['warnings']} warning(s), "
                f"{summary['hold']} rule(s) hold, {summary['not_applicable']} not applicable to this job"
                f"{'' if args.verbose else ' (-v lists them)'}", soft_wrap=True)
    return 1 if errors else 0


# -- --explain ---------------------------------------------------------------------------------------------------------
class _Recorder:
    """A read-only view of a SyncConfig that records which members a config rule reads (for --explain)."""
    _NESTED = ("trainer", "rollout", "packing", "transport")

    def __init__(self, obj, path: str, log: list):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        v = getattr(self._obj, name)
        path = self._path + name
        if not self._path and name in self._NESTED and is_dataclass(v):
            return _Recorder(v, path + ".", self._log)
        if path not in self._log:
            self._log.append(path)
        return v


def _lookup(rule: str):
    from ..errors import UsageError
    reg = _registry()
    inv = reg.get(rule) or reg.get(rule.upper())
    if inv is None:
        near = difflib.get_close_matches(rule.upper(), list(reg), n=1, cutoff=0.5)
        raise UsageError(f"--explain {rule}: no such rule" + (f"; did you mean {near[0]}?" if near else
                                                                 "; `fp8check catalog` lists them"))
    return inv


def explain_text(inv) -> dict:
    kind = {"job": "job rule", "config": "config rule"}.get(inv.scope, f"{inv.scope} rule (judged on snapshots, "
                                                                         "not by preflight)")
    return {"rule": inv.id, "title": inv.title, "family": inv.family, "scope": kind,
            "severity": inv.severity, "condition": inv.condition, "source": inv.source, "why": inv.why}


def explain_job(inv, job) -> dict:
    """The rule's verdict on this job, its findings, and the provenance of every value it read."""
    from fp8check.invariants import CheckContext, not_applicable, run_invariant
    job.reads.clear()
    log: list = []
    if inv.scope not in ("job", "config"):
        return {"verdict": "not judged by preflight (it needs snapshots: fp8check verify / live)",
                "findings": [], "read": []}
    why = not_applicable(inv, CheckContext(job.config, job=job))
    if why is not None:
        return {"verdict": f"not applicable: {why}", "findings": [], "read": []}
    cfg = _Recorder(job.config, "", log)
    findings = run_invariant(inv, CheckContext(cfg, job=job))
    verdict = "pass"
    for f in findings:
        if f.verdict == "fail":
            verdict = "fail" if f.evidence.get("severity", inv.severity) == "error" else "fail (warning)"
        elif f.verdict == "unknown" and verdict == "pass":
            verdict = "unknown"
    read, seen = [], set()
    for kind, name in job.reads:
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        key, value, origin = job.provenance(kind, name)
        read.append({"reads": f"{kind} {name}", "kind": kind, "name": name, "key": key, "value": value,
                     "from": origin})
    for path in log:
        for s in DERIVED.get(path, (path,)):
            if s in job.sources and ("config", s) not in seen:
                seen.add(("config", s))
                key, value = job.sources[s]
                read.append({"reads": f"SyncConfig {s}", "kind": "SyncConfig", "name": s, "key": key, "value": value,
                             "from": "resolved by preflight"})
    shown = []
    for f in findings:
        if f.verdict == "pass":
            continue
        key, value = f.evidence.get("key", f.tensor), f.evidence.get("value")
        if inv.scope != "job" and key in job.sources:        # a SyncConfig field: the key the user changes
            key, value = job.sources[key]
        shown.append({"verdict": f.verdict, "key": key, "value": value, "tensor": f.tensor, "message": f.message,
                      "fix": f.evidence.get("fix", "")})
    return {"verdict": verdict, "findings": shown, "read": read}


def explain(args) -> int:
    inv = _lookup(args.explain)
    out = explain_text(inv)
    if args.config:
        job = read_job(args)
        out["config"] = args.config
        out["stack"] = job.stack
        from ..jobconfig.versions import JUDGED
        out["judged_against"] = JUDGED[job.stack]
        out.update(explain_job(inv, job))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    from .report import console
    c = console()
    p = lambda text: c.print(text, soft_wrap=True, markup=False)  # noqa: E731 - user data, never rich markup
    p(f"{inv.id}  {inv.title}  [{out['scope']}, {inv.severity}]")
    p(f"condition: {inv.condition}")
    p(f"source:    {inv.source or '-'}")
    p(f"why:       {inv.why or '-'}")
    if args.config:
        p(f"verdict on {args.config} ({job.stack}, judged against {out['judged_against']}): {out['verdict']}")
        for f in out["findings"]:
            v = "" if f["value"] is None else f" = {f['value']}"
            p(f"  {f['verdict']:7s} {f['key']}{v}: {f['message']}" + (f"  fix: {f['fix']}" if f["fix"] else ""))
        p("values it read:" if out["read"] else "values it read: none")
        for r in out["read"]:
            what = "" if r["kind"] in ("key", "env") or r["name"] == r["key"] else f"[{r['kind']} {r['name']}] "
            p(f"  {what}{r['key']} = {r['value']!r}  <- {r['from']}")
    return 0


def register(sub):
    p = sub.add_parser("preflight", help="validate an RL job's FP8 config and environment")
    p.add_argument("config", nargs="?", help="job YAML (SkyRL, verl or NeMo RL keys, nested or dotted)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="override an environment variable")
    p.add_argument("--gpu", default="auto", help="sm90 | sm100 | sm120 | auto (detect; Hopper when no GPU)")
    p.add_argument("--probe", action="store_true", help="one live sync round trip on a tiny model (GPU)")
    p.add_argument("--explain", metavar="RULE", help="print the rule, why it exists and what to change; with a "
                                                     "config, its verdict and the provenance of every value it read")
    from .args import LAYERS_HELP, MODEL_HELP
    p.add_argument("--model", metavar="MODEL", help=MODEL_HELP + " (instead of the job's model)")
    p.add_argument("--layers", type=int, metavar="N", help=LAYERS_HELP)
    p.add_argument("-v", "--verbose", action="store_true", help="also list the rules that hold")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=run)
