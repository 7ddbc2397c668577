"""What the comparison must show, with tolerances fixed before the run (never fitted to it), judged from the
run's own records. Each claim is `holds`, `violated` or `unknown` (not measurable here: an arm missing, one
seed, no finite value); `fp8check e2e` exits 1 when one is violated.

  sync-<arm>           every sync of every step and seed shows the arm's verdict pattern (e2e/rl/arms.py):
                       on-policy arms hold S1-S7; naive-fp8 violates S2; bf16 holds S1, S4-S7 with S2 / S3
                       unknown (no FP8 tensor to compare)
  naive-over-onpolicy  naive-fp8's mean |dlogprob| is clearly above onpolicy-fp8's: the lower end of the 95%
                       interval of their paired ratio is above `naive_over_onpolicy_min`
  onpolicy-over-bf16   onpolicy-fp8 stays within a small multiple of the bf16 floor: the upper end of the
                       interval of that ratio is below `onpolicy_over_bf16_max` (the SkyRL article: about 3x)
  learning-<arm>       the policy learns: mean reward over the last k steps minus the first k (k = steps / 3,
                       at most 10), averaged over seeds, is at least `min_reward_gain`
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .arms import ARMS, SYNC_IDS
from .stats import finite, mean_interval, paired, series

HOLDS, VIOLATED, UNKNOWN = "holds", "violated", "unknown"


@dataclass(frozen=True)
class Tolerances:
    naive_over_onpolicy_min: float = 1.5
    onpolicy_over_bf16_max: float = 5.0
    min_reward_gain: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


def _claim(cid: str, text: str, verdict: str, detail: str, **data) -> dict:
    return {"id": cid, "claim": text, "verdict": verdict, "detail": detail, **data}


def sync_claim(arm: str, runs: list[dict], steps: list[dict]) -> dict:
    a = ARMS[arm]
    syncs = [(f"seed {r['seed']} initial", r["initial_sync"]["verdicts"]) for r in runs if r["arm"] == arm]
    syncs += [(f"seed {r['seed']} step {r['step']}", r["sync"]["verdicts"]) for r in steps if r["arm"] == arm]
    want = {**{i: "pass" for i in a.holds}, **{i: "fail" for i in a.violates}, **{i: "unknown" for i in a.unknown}}
    text = ", ".join(f"{'/'.join(i for i in SYNC_IDS if want.get(i) == v)} {v}"
                     for v in ("pass", "fail", "unknown") if any(w == v for w in want.values()))
    if not syncs:
        return _claim(f"sync-{arm}", f"{arm}: every sync shows {text}", UNKNOWN, "arm not run")
    bad = [(where, i, v.get(i)) for where, v in syncs for i, w in want.items() if v.get(i) != w]
    detail = f"{len(syncs) - len({b[0] for b in bad})} of {len(syncs)} syncs as expected"
    if bad:
        detail += "; first deviations: " + "; ".join(f"{w}: {i} {v}" for w, i, v in bad[:4])
    return _claim(f"sync-{arm}", f"{arm}: every sync shows {text}", VIOLATED if bad else HOLDS, detail,
                  syncs=len(syncs), deviations=len(bad))


def ratio_claim(cid: str, steps: list[dict], a: str, b: str, bound: float, above: bool) -> dict:
    rel = "lower end above" if above else "upper end below"
    text = f"mean |dlogprob| {a} / {b}: 95% interval {rel} {bound:g}"
    arms = {r["arm"] for r in steps}
    if a not in arms or b not in arms:
        return _claim(cid, text, UNKNOWN, f"needs arms {a} and {b}")
    p = paired(steps, "mean_abs_dlogprob", a, b, log=True)
    detail = f"ratio {p['mean']:.3g} [{p['low']:.3g}, {p['high']:.3g}] over {p['n']} seed(s); per seed " + \
        ", ".join(f"{v:.3g}" for v in p["per_seed"].values())
    edge = p["low"] if above else p["high"]
    if not finite(edge):
        return _claim(cid, text, UNKNOWN, detail + " (no interval: needs two seeds or more)", estimate=p)
    ok = edge > bound if above else edge < bound
    return _claim(cid, text, HOLDS if ok else VIOLATED, detail, estimate={k: v for k, v in p.items() if k != "per_step"})


def learning_claim(arm: str, steps: list[dict], gain: float) -> dict:
    text = f"{arm} learns: reward gain (last k steps - first k) >= {gain:g}"
    s = series(steps, "reward").get(arm, {})
    gains = []
    for d in s.values():
        ts = sorted(d)
        k = min(10, len(ts) // 3)
        if k:
            gains.append(sum(d[t] for t in ts[-k:]) / k - sum(d[t] for t in ts[:k]) / k)
    mi = mean_interval(gains)
    if not gains:
        return _claim(f"learning-{arm}", text, UNKNOWN, "too few steps (needs 3 or more)")
    detail = f"gain {mi['mean']:.3f} over {mi['n']} seed(s)" + \
        (f" [{mi['low']:.3f}, {mi['high']:.3f}]" if finite(mi["low"]) else "")
    return _claim(f"learning-{arm}", text, HOLDS if mi["mean"] >= gain else VIOLATED, detail, gain=mi)


def evaluate(runs: list[dict], steps: list[dict], tol: Tolerances = Tolerances()) -> list[dict]:
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    out = [sync_claim(a, runs, steps) for a in arms]
    out.append(ratio_claim("naive-over-onpolicy", steps, "naive-fp8", "onpolicy-fp8", tol.naive_over_onpolicy_min, True))
    out.append(ratio_claim("onpolicy-over-bf16", steps, "onpolicy-fp8", "bf16", tol.onpolicy_over_bf16_max, False))
    out += [learning_claim(a, steps, tol.min_reward_gain) for a in arms]
    return out
