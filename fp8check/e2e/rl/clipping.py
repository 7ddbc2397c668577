"""Calibrated clipping, as implemented here (the paper, arXiv 2609.22870, has no public code; this is our
reading of its description, stated exactly):

FP8 noise widens the distribution of importance ratios, so the PPO lower bound zeroes the gradient of more
negative-advantage tokens than it would in BF16. The fix matches the FP8 clip rate to the BF16 one, per batch:

1. BF16 shadow (`bf16_reference_ratios`): on the same batch, the ratios a BF16 run would see on these tokens --
   the learner's numerics (fp32 activations) over the sampler's numerics (activations stored in BF16, as the
   rollout engine serves), both on BF16 weights rounded from the learner's fp32 masters (no FP8 anywhere).
   That is the bf16 arm's train-rollout pair, evaluated on this batch.
2. Lower bound (`calibrate_clip`): q_low = the share of negative-advantage tokens whose BF16 ratio is below the
   nominal lower bound 1 - eps_low; the FP8 lower bound becomes the q_low-quantile of the FP8 ratios of the
   negative-advantage tokens (linear interpolation; q_low = 0 gives their minimum, so the strict test
   `ratio < low` clips none of them), never above 1 - eps_low.
3. Upper bound, rebalanced the same way: q_high = the share of positive-advantage tokens whose BF16 ratio is
   above 1 + eps_high; the FP8 upper bound becomes the (1 - q_high)-quantile of the FP8 ratios of the
   positive-advantage tokens, never below 1 + eps_high.

The bounds are never tighter than the nominal ones (calibration only gives back gradients FP8 noise took), and
they apply to this batch's one optimizer step.
"""
from __future__ import annotations

import torch

from fp8check.harness.engines.cpu.rollout import ReferenceRollout
from fp8check.harness.numerics.forward import Weights, logits

SERVING_DTYPE = ReferenceRollout.serving_dtype       # the rollout engine's activations (BF16, as vLLM serves)


def calibrate_clip(ratio: torch.Tensor, reference: torch.Tensor, advantages: torch.Tensor, low: float,
                   high: float) -> tuple[float, float, dict]:
    """(low, high, info) for one batch: FP8 `ratio`s and BF16 `reference` ratios of the same tokens (1-D),
    with their `advantages`; `low` / `high`: the nominal ratio bounds."""
    info: dict = {}
    neg, pos = advantages < 0, advantages > 0
    new_low, new_high = low, high
    if bool(neg.any()):
        q = float((reference[neg] < low).double().mean())
        new_low = min(low, float(torch.quantile(ratio[neg], q)))
        info["calib_q_low"] = q
    if bool(pos.any()):
        q = float((reference[pos] > high).double().mean())
        new_high = max(high, float(torch.quantile(ratio[pos], 1.0 - q)))
        info["calib_q_high"] = q
    return new_low, new_high, info


def bf16_reference_ratios(spec, master_hf: dict, sequences: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T-1] BF16 shadow ratios exp(lp_learner - lp_sampler) of every target token of `sequences`."""
    w = {n: t.to(torch.bfloat16).float() for n, t in master_hf.items()}
    tgt = sequences[:, 1:, None]
    with torch.no_grad():
        lp = [(logits(spec, Weights(w, frozenset(), None, act_dtype=dt), sequences)[:, :-1] / temperature)
              .log_softmax(-1).gather(-1, tgt)[..., 0] for dt in (None, SERVING_DTYPE)]
    return torch.exp(lp[0] - lp[1])
