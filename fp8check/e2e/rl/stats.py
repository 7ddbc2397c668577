"""Statistics over seeds: seeds are the independent replicates; within a seed the arms are paired step by step
(same initial masters, prompts and sampling noise), so a comparison is made on per-step paired differences
(or log-ratios), averaged over steps within each seed, then summarised across seeds with a Student-t 95%
interval (K seeds: K - 1 degrees of freedom; one seed gives no interval). Per-step bands across seeds for the
plots use the same interval.
"""
from __future__ import annotations

import math
from collections import defaultdict

# two-sided 95% Student-t critical values, df 1..30 (beyond: the normal 1.96)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def mean_interval(values: list[float]) -> dict:
    """Mean and 95% t-interval of independent values (nan interval for fewer than two)."""
    v = [x for x in values if finite(x)]
    if not v:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    m = sum(v) / len(v)
    if len(v) < 2:
        return {"mean": m, "low": float("nan"), "high": float("nan"), "n": len(v)}
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    h = t95(len(v) - 1) * sd / math.sqrt(len(v))
    return {"mean": m, "low": m - h, "high": m + h, "n": len(v)}


def series(steps: list[dict], metric: str) -> dict:
    """arm -> seed -> {step: value}."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in steps:
        v = r.get(metric)
        if finite(v):
            out[r["arm"]][r["seed"]][r["step"]] = float(v)
    return out


def per_step_band(steps: list[dict], metric: str) -> dict:
    """arm -> [(step, mean, low, high)] across seeds."""
    s = series(steps, metric)
    out = {}
    for arm, by_seed in s.items():
        all_steps = sorted({t for d in by_seed.values() for t in d})
        out[arm] = [(t, *(lambda mi: (mi["mean"], mi["low"], mi["high"]))(
            mean_interval([d[t] for d in by_seed.values() if t in d]))) for t in all_steps]
    return out


def paired(steps: list[dict], metric: str, a: str, b: str, log: bool = False) -> dict:
    """Arm a vs arm b on `metric`, paired by (seed, step). log=False: differences a - b; log=True: log-ratios
    log(a / b) over steps where both are positive, reported back as ratios. Returns the per-seed means, the
    across-seed estimate with its 95% interval, and the per-step band of the paired values across seeds."""
    s = series(steps, metric)
    per_seed, per_step = {}, defaultdict(list)
    for seed in sorted(set(s.get(a, {})) & set(s.get(b, {}))):
        xa, xb = s[a][seed], s[b][seed]
        vals = []
        for t in sorted(set(xa) & set(xb)):
            if log:
                if xa[t] > 0 and xb[t] > 0:
                    vals.append((t, math.log(xa[t] / xb[t])))
            else:
                vals.append((t, xa[t] - xb[t]))
        if vals:
            per_seed[seed] = sum(v for _, v in vals) / len(vals)
            for t, v in vals:
                per_step[t].append(v)
    est = mean_interval(list(per_seed.values()))
    band = [(t, *(lambda mi: (mi["mean"], mi["low"], mi["high"]))(mean_interval(v))) for t, v in sorted(per_step.items())]
    if log:
        est = {k: (math.exp(v) if k != "n" and finite(v) else v) for k, v in est.items()}
        per_seed = {k: math.exp(v) for k, v in per_seed.items()}
        band = [(t, *(math.exp(x) if finite(x) else x for x in rest)) for t, *rest in band]
    return {"metric": metric, "a": a, "b": b, "kind": "ratio" if log else "difference", "per_seed": per_seed,
            **est, "per_step": band}


def arm_summary(steps: list[dict], metric: str, first: int | None = None, last: int | None = None) -> dict:
    """arm -> mean of `metric` over steps (all, or the first / last k) per seed, then across seeds."""
    s = series(steps, metric)
    out = {}
    for arm, by_seed in s.items():
        vals = []
        for d in by_seed.values():
            ts = sorted(d)
            if first:
                ts = ts[:first]
            if last:
                ts = ts[-last:]
            if ts:
                vals.append(sum(d[t] for t in ts) / len(ts))
        out[arm] = mean_interval(vals)
    return out
