"""Figures: one PNG per metric with the arms overlaid (each seed a faint line, the mean over seeds bold; the
95% intervals over seeds are in the report's tables -- with a few seeds they are wide enough to hide the
curves), the paired per-step ratios of the mismatch metric between arms (per seed faint, geometric mean
bold), and the per-step sync verdicts. matplotlib is an optional dependency (the `e2e` extra); `require_matplotlib` says so in one line."""
from __future__ import annotations

import math
import os

from .arms import ARMS, SYNC_IDS
from .metrics import METRICS
from .stats import finite, paired, per_step_band, series

COLORS = {"bf16": "#1f77b4", "naive-fp8": "#d62728", "roundtrip-fp8": "#ff7f0e", "bf16-fp8-rollout": "#8c564b",
          "bf16-block-rollout": "#e377c2", "bf16-sampler": "#17becf", "other-grid": "#bcbd22",
          "onpolicy-fp8": "#2ca02c", "calibrated-clip": "#9467bd"}
VERDICT_CODE = {"pass": 0, "unknown": 1, "fail": 2}
# the paired comparisons plotted (and tabulated): arm a over arm b
PAIRS = (("naive-fp8", "onpolicy-fp8"), ("roundtrip-fp8", "onpolicy-fp8"), ("bf16-fp8-rollout", "onpolicy-fp8"),
         ("bf16-block-rollout", "onpolicy-fp8"), ("bf16-sampler", "onpolicy-fp8"), ("other-grid", "onpolicy-fp8"),
         ("onpolicy-fp8", "bf16"), ("calibrated-clip", "onpolicy-fp8"))


class MissingMatplotlib(RuntimeError):
    """Plots were asked for and matplotlib is not installed."""


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib("plots need matplotlib, which is not installed: pip install 'fp8check[e2e]' "
                                "(or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _arms(steps):
    return [a for a in ARMS if a in {r["arm"] for r in steps}]


def plot_metric(plt, steps, metric, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    s, band = series(steps, metric.key), per_step_band(steps, metric.key)
    seeds = 0
    for arm in _arms(steps):
        c = COLORS.get(arm)
        seeds = max(seeds, len(s.get(arm, {})))
        for d in s.get(arm, {}).values():
            ts = [t for t in sorted(d) if d[t] > 0 or not metric.log]
            ax.plot(ts, [d[t] for t in ts], color=c, alpha=0.3, lw=0.7)
        rows = [r for r in band.get(arm, []) if r[1] > 0 or not metric.log]
        if rows:
            ax.plot([r[0] for r in rows], [r[1] for r in rows], color=c, lw=2, label=arm)
    if metric.log:
        ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_title(f"{metric.label}\n(bold: mean over {seeds} seed(s); faint: each seed)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pairs(plt, steps, path, tolerances=None):
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    s = series(steps, "mean_abs_dlogprob")
    for a, b in PAIRS:
        p = paired(steps, "mean_abs_dlogprob", a, b, log=True)
        if not p["per_step"]:
            continue
        drawn = True
        c = COLORS.get(a)
        for seed in p["per_seed"]:
            xa, xb = s[a][seed], s[b][seed]
            ts = [t for t in sorted(set(xa) & set(xb)) if xa[t] > 0 and xb[t] > 0]
            ax.plot(ts, [xa[t] / xb[t] for t in ts], color=c, alpha=0.3, lw=0.7)
        ax.plot([r[0] for r in p["per_step"]], [r[1] for r in p["per_step"]], color=c, lw=2,
                label=f"{a} / {b}: {p['mean']:.3g}" + (f" [{p['low']:.3g}, {p['high']:.3g}]" if finite(p["low"]) else ""))
    ax.axhline(1.0, color="k", lw=0.8)
    for v, what in ((tolerances or {}).get("naive_over_onpolicy_min"), "naive/on-policy min"), \
                   ((tolerances or {}).get("onpolicy_over_bf16_max"), "on-policy/bf16 max"):
        if v:
            ax.axhline(v, color="grey", lw=0.8, ls="--")
            ax.text(0, v, f" {what} {v:g}", fontsize=7, va="bottom", color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_title("paired per-step ratio of mean |dlogprob| (bold: geometric mean over seeds; faint: each seed;\n"
                 "legend: estimate over steps and seeds [95% interval over seeds])")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdict_grid(steps):
    """rows (arm, invariant) x steps: the worst verdict over seeds (fail > unknown > pass)."""
    arms = _arms(steps)
    n = 1 + max((r["step"] for r in steps), default=-1)
    grid = {(a, i): [None] * n for a in arms for i in SYNC_IDS}
    for r in steps:
        for i in SYNC_IDS:
            v = VERDICT_CODE.get(r["sync"]["verdicts"].get(i, "unknown"), 1)
            cur = grid[(r["arm"], i)][r["step"]]
            grid[(r["arm"], i)][r["step"]] = v if cur is None else max(cur, v)
    return grid


def plot_verdicts(plt, steps, path):
    from matplotlib.colors import ListedColormap
    grid = verdict_grid(steps)
    rows = list(grid)
    data = [[math.nan if v is None else v for v in grid[k]] for k in rows]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(rows) + 1.2))
    ax.imshow(data, aspect="auto", interpolation="nearest", vmin=0, vmax=2,
              cmap=ListedColormap(["#4caf50", "#bdbdbd", "#e53935"]))
    ax.set_yticks(range(len(rows)), [f"{a} {i}" for a, i in rows], fontsize=7)
    ax.set_xlabel("RL step (the sync after it)")
    ax.set_title("sync verdicts per step (green pass, grey unknown, red fail; worst over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(steps: list[dict], out: str, tolerances: dict | None = None) -> list[tuple[str, str]]:
    """Every figure under out/plots; returns (title, path relative to out)."""
    plt = require_matplotlib()
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    figs = []
    for m in METRICS:
        rel = os.path.join("plots", f"{m.key}.png")
        plot_metric(plt, steps, m, os.path.join(out, rel))
        figs.append((m.label, rel))
    rel = os.path.join("plots", "paired_mismatch_ratio.png")
    plot_pairs(plt, steps, os.path.join(out, rel), tolerances)
    figs.append(("paired mismatch ratios between arms", rel))
    rel = os.path.join("plots", "sync_verdicts.png")
    plot_verdicts(plt, steps, os.path.join(out, rel))
    figs.append(("sync verdicts per step", rel))
    return figs
