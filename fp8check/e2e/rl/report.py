"""The comparison's summary: summary.json (claims, paired estimates, per-arm means), report.md and report.html
(the same content: what was run, the claims, the figures, the paired comparisons and a table at the end).
Everything in it is computed from the run's own records (steps.jsonl, runs.jsonl)."""
from __future__ import annotations

import html
import json
import os

from .arms import ARMS, SYNC_IDS
from .claims import VIOLATED
from .clipping import __doc__ as CLIPPING_DOC
from .loop import jsonable
from .metrics import METRICS
from .plots import PAIRS
from .stats import arm_summary, finite, paired

FLOOR = ("The BF16 floor on CPU: two identical fp32 forwards agree exactly, so the arms' engines differ in one "
         "stated, physical way -- the rollout engine serves with activations stored in BF16 (every GEMM reads "
         "BF16 inputs and writes BF16 outputs, logits included, and the residual stream is BF16, as vLLM runs the "
         "model in its bfloat16 dtype) while the learner computes activations in fp32. The bf16 arm's mismatch is "
         "that difference alone; the FP8 arms add the FP8 GEMMs (weights and activations quantized) on top of it. "
         "Real engine pairs also differ in kernels (accumulation order, fused attention), which a CPU mirror does "
         "not model.")
FLOOR_LIVE = ("The BF16 floor on live engines: the learner is Megatron-Core with Transformer Engine, the sampler "
              "vLLM in bfloat16, so the bf16 arm's mismatch is their whole numeric difference (activation dtype, "
              "GEMM kernels and accumulation order, fused attention); the FP8 arms add the FP8 GEMMs on top of it.")


def _fmt(x, spec=".3g"):
    return format(x, spec) if finite(x) else "n/a"


def _ci(mi, spec=".3g"):
    s = _fmt(mi["mean"], spec)
    if finite(mi.get("low")):
        s += f" [{_fmt(mi['low'], spec)}, {_fmt(mi['high'], spec)}]"
    return s


def verdict_counts(runs: list[dict], steps: list[dict], arm: str) -> str:
    """e.g. 'S1-S7 pass 61/61' or 'S2 fail 61/61, S1 fail 61/61, ...' over the initial and every step's sync."""
    syncs = [r["initial_sync"]["verdicts"] for r in runs if r["arm"] == arm] + \
        [r["sync"]["verdicts"] for r in steps if r["arm"] == arm]
    if not syncs:
        return "-"
    parts = []
    for v in ("fail", "unknown"):
        ids = [i for i in SYNC_IDS if any(s.get(i) == v for s in syncs)]
        parts += [f"{i} {v} {sum(s.get(i) == v for s in syncs)}/{len(syncs)}" for i in ids]
    ok = [i for i in SYNC_IDS if all(s.get(i) == "pass" for s in syncs)]
    if ok:
        parts.insert(0, f"{','.join(ok)} pass {len(syncs)}/{len(syncs)}")
    return "; ".join(parts)


def stage_counts(steps: list[dict], arm: str, inv: str) -> dict:
    """Where an invariant's failures were found (wire / engine / ...), summed over the arm's steps."""
    out: dict = {}
    for r in steps:
        if r["arm"] == arm:
            for st, k in r["sync"].get("stages", {}).get(inv, {}).items():
                out[st] = out.get(st, 0) + k
    return out


def build(runs: list[dict], steps: list[dict], claims: list[dict], meta: dict) -> tuple[dict, list]:
    arms = [a for a in ARMS if a in {r["arm"] for r in runs}]
    k = max(1, min(10, (1 + max((r["step"] for r in steps), default=0)) // 3))
    per_arm = {m.key: arm_summary(steps, m.key) for m in METRICS}
    first, last = arm_summary(steps, "reward", first=k), arm_summary(steps, "reward", last=k)
    pairs = [paired(steps, "mean_abs_dlogprob", a, b, log=True) for a, b in PAIRS if a in arms and b in arms]
    step0 = [s for s in steps if s["step"] == 0]
    firsts = [paired(step0, "mean_abs_dlogprob", a, b, log=True) for a, b in PAIRS if a in arms and b in arms]
    summary = {"meta": meta, "claims": claims, "arms": arms,
               "per_arm": per_arm, "reward_first": first, "reward_last": last, "window": k,
               "pairs": [{kk: v for kk, v in p.items() if kk != "per_step"} for p in pairs],
               "pairs_first_step": [{kk: v for kk, v in p.items() if kk != "per_step"} for p in firsts],
               "verdicts": {a: verdict_counts(runs, steps, a) for a in arms},
               "s2_stages": {a: stage_counts(steps, a, "S2") for a in arms}}
    doc = [("h1", "fp8check e2e: the seeds' FP8 configurations vs on-policy FP8 in a GRPO loop"),
           ("p", f"Command: `{meta.get('command', '')}`. Model {meta['settings']['model']}, recipe "
                 f"{meta['settings']['recipe']}, task {meta['settings']['task']} ({meta['settings']['length']} digits), "
                 f"{meta['steps']} RL steps after {meta['settings']['warmup_steps']} supervised warm-up steps, "
                 f"{meta['seeds']} seed(s), {meta['settings']['prompts_per_step']} prompts x "
                 f"{meta['settings']['group_size']} completions per step, engines: {meta['settings']['engines']}. "
                 + (f"Wall time {meta.get('wall_seconds', 0):.0f} s with {meta['jobs']} worker process(es)."
                    if meta.get("jobs") else
                    f"Joined from {len(meta.get('merged_from') or [])} parts; the runs' own wall times add up to "
                    f"{meta.get('wall_seconds', 0):.0f} s.")),
           ("p", FLOOR_LIVE if meta["settings"]["engines"] == "live" else FLOOR),
           ("h2", "Claims (tolerances fixed before the run)"),
           ("table", ["claim", "verdict", "detail"],
            [[c["claim"], c["verdict"], c["detail"]] for c in claims]),
           ("h2", "Arms"),
           ("table", ["arm", "configuration"], [[a, ARMS[a].description] for a in arms]),
           ("h2", "Published numbers beside these (other models, tasks and scales: orderings compare, magnitudes do not)"),
           ("table", ["source", "configuration", "figure"], [list(r) for r in PUBLISHED]),
           ("h2", "Figures")]
    for title, rel in meta.get("figures", []):
        doc.append(("img", title, rel))
    doc += [("h2", "Paired comparisons of mean |dlogprob| (seeds independent, steps paired)"),
            ("p", "Within a seed the arms start from the same masters and see the same prompts and sampling noise, "
                  "but their policies drift apart as they train, and the mismatch shrinks with the policy's entropy: "
                  "the whole-run ratio compares arms at different states. At the first RL step the FP8 arms hold "
                  "masters warmed up the same way, so that column compares the syncs on nearly one policy (the "
                  "delayed-scaling and BF16 learners warmed up on their own numerics); bf16 warmed up in BF16."),
            ("table", ["arms", "whole run: ratio [95% interval]", "per seed", "first step: ratio [95% interval]",
                       "per seed"],
             [[f"{p['a']} / {p['b']}", _ci(p), ", ".join(_fmt(v) for v in p["per_seed"].values()), _ci(f),
               ", ".join(_fmt(v) for v in f["per_seed"].values())] for p, f in zip(pairs, firsts)]),
            ("h2", "Where S2 failed (findings by stage, summed over steps)"),
            ("table", ["arm", "S2 findings by stage"],
             [[a, ", ".join(f"{s}: {n}" for s, n in sorted(summary['s2_stages'][a].items())) or "-"] for a in arms]),
            ("h2", "Calibrated clipping, as implemented"), ("pre", CLIPPING_DOC.strip()),
            ("h2", "Table (mean over steps per seed, then over seeds [95% interval])"),
            ("table", ["arm", f"reward first {k}", f"reward last {k}"] + [m.key for m in METRICS if m.table and m.key != "reward"],
             [[a, _ci(first[a]), _ci(last[a])] + [_ci(per_arm[m.key].get(a, {"mean": float('nan')}))
                                                   for m in METRICS if m.table and m.key != "reward"] for a in arms]),
            ("table", ["arm", "sync verdicts (the initial sync and the one after every step, all seeds)"],
             [[a, summary["verdicts"][a]] for a in arms])]
    return summary, doc


# what the seeds and the stacks published (the sources), quoted beside this run's figures
PUBLISHED = (
    ("SkyRL article, Fig. 1", "Qwen3.5-4B DAPO; TE delayed scaling + vLLM quantization='fp8' (naive-fp8)",
     "unstable within 70 steps; mean importance ratio 0.75; clip ratio > 10x BF16"),
    ("SkyRL article, Fig. 4", "Qwen3.5-9B, 400 steps; on-policy sync vs BF16 trainer + independent FP8 rollout",
     "on-policy 0.02-0.03 mean |dlogprob| (~3x two BF16 passes); independent starts higher, > 0.05 by step 400"),
    ("MXFP8 paper 2610.34915", "Qwen3-8B / 30B-A3B, verl, B200; FP8 learner, sampler on vs off its grid",
     "train-rollout KL 11 % lower (half the linears on the grid), 16 % lower (all); other grid on MoE 2x from step 1"),
    ("miles#2722", "DeepSeek-V4", "mean |dlogprob| 0.041 BF16 vs 0.067 FP8"),
    ("verl#7519", "verl rollout.quantization=fp8", "probability difference ~0.015 quantized vs ~0.004 BF16"),
    ("NeMo-RL#2744", "vllm_cfg.precision fp8", "gen_kl_error 0.0014-0.0031; 'broken refit' threshold 0.004"),
)


def to_markdown(doc) -> str:
    out = []
    for kind, *rest in doc:
        if kind == "h1":
            out.append(f"# {rest[0]}\n")
        elif kind == "h2":
            out.append(f"## {rest[0]}\n")
        elif kind == "p":
            out.append(rest[0] + "\n")
        elif kind == "pre":
            out.append("```\n" + rest[0] + "\n```\n")
        elif kind == "img":
            out.append(f"![{rest[0]}]({rest[1]})\n")
        elif kind == "table":
            head, rows = rest
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
            out.append("")
    return "\n".join(out)


def to_html(doc) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>fp8check e2e</title><style>body{font-family:"
           "sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:13px}td,th{border:1px "
           "solid #ccc;padding:3px 6px}.violated{color:#c00;font-weight:bold}img{max-width:100%}</style></head><body>"]
    for kind, *rest in doc:
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{e(rest[0])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{e(rest[0])}</p>")
        elif kind == "pre":
            out.append(f"<pre>{e(rest[0])}</pre>")
        elif kind == "img":
            out.append(f"<figure><img src='{e(rest[1])}' alt='{e(rest[0])}'><figcaption>{e(rest[0])}</figcaption></figure>")
        elif kind == "table":
            head, rows = rest
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for r in rows:
                out.append("<tr>" + "".join(f"<td class='{e(str(c))}'>{e(str(c))}</td>" for c in r) + "</tr>")
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(out: str, runs: list[dict], steps: list[dict], claims: list[dict], meta: dict) -> dict:
    summary, doc = build(runs, steps, claims, meta)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(jsonable(summary), f, indent=1, allow_nan=False)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(to_markdown(doc))
    with open(os.path.join(out, "report.html"), "w") as f:
        f.write(to_html(doc))
    summary["failed"] = [c["id"] for c in claims if c["verdict"] == VIOLATED]
    return summary
