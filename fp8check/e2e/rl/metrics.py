"""The per-step metrics the comparison plots and tabulates (one list: plots, the report's table and the tests
read it). Each is a key of a step record (e2e/rl/loop.py `step_record`); the mismatch and clip metrics come
from fp8check.invariants.probes.probe_metrics over the batch's completion tokens."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    log: bool = False          # plotted on a log axis
    table: bool = True         # a column of the report's table


METRICS = (
    Metric("reward", "reward (fraction of right digits)"),
    Metric("accuracy", "exact-match accuracy", table=False),
    Metric("entropy", "policy entropy per completion token (nats)"),
    Metric("response_length", "completion length (tokens, EOS included)"),
    Metric("mean_abs_dlogprob", "train-rollout mean |dlogprob|", log=True),
    Metric("kl", "KL(rollout || train), k3", log=True),
    Metric("ratio_mean", "importance ratio mean"),
    Metric("ratio_p05", "importance ratio 5% quantile"),
    Metric("ratio_p50", "importance ratio median", table=False),
    Metric("ratio_p95", "importance ratio 95% quantile"),
    Metric("clip_fraction_pos", "clipped share of A>0 tokens (ratio > high)"),
    Metric("clip_fraction_neg", "clipped share of A<0 tokens (ratio < low)"),
    Metric("clip_fraction_neg_nominal", "share of A<0 tokens below the nominal bound 1 - eps_low", table=False),
    Metric("clip_low", "lower ratio bound used (calibrated-clip: per batch)", table=False),
    Metric("clip_high", "upper ratio bound used (calibrated-clip: per batch)", table=False),
    Metric("token_mult_prob_error", "token_mult_prob_error (mean exp|dlogprob|)"),
)
