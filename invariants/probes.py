"""P family: behavioural backstop. On fixed prompts, the sampler's log-probs vs the learner's, within bounds.

Field thresholds for orientation: mean |dlogprob| < 0.05, token_mult_prob_error median < 1.1, generation KL
< 0.01. A fixed bound does not scale with the model (the engines' own numeric gap grows with depth and width),
so the bounds are calibrated per model and engine pair, never tighter than the field thresholds:
* live: on the first sync whose S1-S7 all held (the session calibrates, `calibrated_bounds`);
* from snapshots: against the floor the same snapshots imply -- the rollout engine's declared forward run on
  the trainer's exact bytes (a perfect sync of these weights), so only what the sync changed can exceed it.
The forward is harness.numerics.forward with each engine's *declared* activation quantizer (the records).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch and the numerics are imported in the checks that compute: pre-flight imports this without them
    import torch

from harness.layouts import scale_name

from .base import CheckContext, fail, invariant, passed, unknown

PROMPTS = [[1, 17, 42, 99, 7, 300, 5, 812, 64, 3, 1999, 250], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
           [1000, 200, 100, 1500, 33, 47, 2047, 0, 512, 128, 64, 32]]
BOUNDS = {"mean_abs_dlogprob": 0.05, "mult_prob_error_median": 1.1, "kl": 0.01}


def prompts_for(vocab_size: int) -> list[list[int]]:
    """The fixed probe prompts, folded into a model's vocabulary."""
    return [[t % vocab_size for t in p] for p in PROMPTS]


def probe_metrics(lp_train: list[torch.Tensor], lp_roll: list[torch.Tensor], advantages: list[torch.Tensor] | None = None,
                  clip_bounds: tuple[float, float] = (0.8, 1.2)) -> dict:
    """Train-rollout mismatch metrics over the same tokens (P1's probe, `fp8check live` and the RL loop's
    per-step metrics all come from here).

    The importance ratio is learner / sampler, exp(lp_train - lp_roll). `token_mult_prob_error` is NeMo-RL's
    token multiplicative probability error, the mean of exp(|dlogprob|) (its median: `mult_prob_error_median`).
    `clip_fraction`: tokens with |ratio - 1| > 0.2. With `advantages` (per token, shaped like the log-probs),
    the PPO clip diagnostics split by advantage sign, for ratio bounds `clip_bounds` = (1 - eps_low,
    1 + eps_high): `clip_fraction_pos`, the share of positive-advantage tokens above the upper bound, and
    `clip_fraction_neg`, the share of negative-advantage tokens below the lower bound -- the tokens whose
    gradient the clipped objective zeroes (nan when there is no token of that sign)."""
    import torch
    t = torch.cat([x.double() for x in lp_train])
    r = torch.cat([x.double() for x in lp_roll])
    d = r - t
    ratio = torch.exp(t - r)                       # learner / sampler importance ratio
    err = torch.exp(d.abs())                       # token_mult_prob_error
    out = {"tokens": int(t.numel()), "mean_abs_dlogprob": float(d.abs().mean()), "max_abs_dlogprob": float(d.abs().max()),
           # KL(sampler || learner) on the sampled tokens, k3 estimator: E[(ratio - 1) - log ratio]
           "kl": float(((ratio - 1) - torch.log(ratio)).mean()),
           "ratio_mean": float(ratio.mean()), "ratio_p05": float(ratio.quantile(0.05)),
           "ratio_p50": float(ratio.quantile(0.5)), "ratio_p95": float(ratio.quantile(0.95)),
           "mult_prob_error_median": float(err.median()), "token_mult_prob_error": float(err.mean()),
           "clip_fraction": float(((ratio - 1).abs() > 0.2).double().mean())}
    if advantages is not None:
        a = torch.cat([x.double() for x in advantages])
        low, high = clip_bounds
        pos, neg = a > 0, a < 0
        out.update({"clip_low": float(low), "clip_high": float(high),
                    "tokens_pos": int(pos.sum()), "tokens_neg": int(neg.sum()),
                    "clip_fraction_pos": float((ratio[pos] > high).double().mean()) if bool(pos.any()) else float("nan"),
                    "clip_fraction_neg": float((ratio[neg] < low).double().mean()) if bool(neg.any()) else float("nan")})
    return out


def calibrated_bounds(reference: dict, factor: float = 2.5) -> dict:
    """Bounds calibrated against a known-good pass: the engines' own numeric difference on this model times
    `factor`, never tighter than the field thresholds."""
    return {k: max(b, (reference[k] - (1.0 if k == "mult_prob_error_median" else 0.0)) * factor
                   + (1.0 if k == "mult_prob_error_median" else 0.0)) for k, b in BOUNDS.items()}


def _model_values(ctx: CheckContext, values: dict, side: str) -> dict | str:
    """HF name -> values for every model tensor, or why they cannot feed the forward."""
    out = {}
    for t in ctx.config.spec.tensors():
        v = values.get(t.name)
        if v is None:
            return f"the {side} lacks {t.name} (see S1/S2)"
        if tuple(v.shape) != tuple(t.shape):
            return f"the {side}'s {t.name} has shape {list(v.shape)}, the model needs {list(t.shape)} (see S4)"
        out[t.name] = v
    return out


def snapshot_logprobs(ctx: CheckContext):
    """(trainer, rollout, floor) log-probs on PROMPTS from the snapshots, or a reason string. FP8 weights enter
    the forward dequantized; high-precision ones as held (BF16, cast to fp32 where the forward uses them: at
    real shapes an fp32 copy of both vocabulary matrices would be 5 GB per side)."""
    from harness.numerics.forward import Weights, act_quant, prompts_logprobs
    cfg, spec = ctx.config, ctx.config.spec
    tv = {}
    for t in spec.tensors():
        v = ctx.trainer_value(t.name) if t.name in cfg.fp8_tensors else ctx.trainer.get(t.name)
        if v is not None:
            tv[t.name] = v
    tv = _model_values(ctx, tv, "trainer snapshot")
    if isinstance(tv, str):
        return tv
    rhf, rv = ctx.rollout_hf, {}
    for t in spec.tensors():
        n = t.name
        if n not in rhf:
            continue
        try:
            rv[n] = cfg.recipe.dequantize_weight(rhf[n], rhf[scale_name(n)]) if n in cfg.fp8_tensors else rhf[n]
        except (KeyError, ValueError, RuntimeError, IndexError, TypeError):
            continue
    rv = _model_values(ctx, rv, "rollout snapshot")
    if isinstance(rv, str):
        return rv
    t_aq = act_quant(ctx.trainer.meta.act_quant if ctx.trainer.meta is not None else "te", cfg.recipe)
    r_aq = act_quant(ctx.rollout.meta.act_quant, cfg.recipe)
    tw = Weights(tv, cfg.fp8_tensors, t_aq)
    rw = Weights(rv, cfg.fp8_tensors, r_aq)
    ideal = Weights(tv, cfg.fp8_tensors, r_aq)
    prompts = prompts_for(spec.vocab_size)
    run = lambda W: prompts_logprobs(spec, W, prompts)  # noqa: E731
    return run(tw), run(rw), run(ideal)


@invariant("P1", "probes", "policy probe",
           "on fixed prompts the sampler's log-probs match the learner's: mean |dlogprob|, token_mult_prob_error "
           "median and KL within bounds calibrated on a verified pass (live) or on the snapshots' own floor, never "
           "tighter than 0.05 / 1.1 / 0.01", needs=("trainer", "rollout"),
           source="fp8check's own")
def p1_probe(ctx: CheckContext):
    m, bounds = ctx.probes, ctx.probe_bounds
    if m is None:
        got = snapshot_logprobs(ctx)
        if isinstance(got, str):
            return [unknown("P1", f"cannot run the probe forward: {got}")]
        lt, lr, floor = got
        m = probe_metrics(lt, lr)
        bounds = bounds or calibrated_bounds(probe_metrics(lt, floor))
    bounds = bounds or BOUNDS
    out = [fail("P1", None, f"{k} = {m[k]:.4g} exceeds {b:.4g}", metrics=m, bounds=bounds)
           for k, b in bounds.items() if m[k] >= b]
    return out or [passed("P1", f"mean |dlogprob| {m['mean_abs_dlogprob']:.2e}, KL {m['kl']:.2e}, ratio "
                                f"[{m['ratio_p05']:.4f}, {m['ratio_p95']:.4f}]", metrics=m, bounds=bounds)]
