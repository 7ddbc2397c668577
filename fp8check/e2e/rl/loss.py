"""The policy loss: GRPO advantages and the PPO-clip objective against the rollout's log-probs.

One optimizer step per batch, so the importance ratio the objective sees, exp(lp_learner - lp_rollout), is
exactly the train-rollout mismatch: the learner's FP8 forward at the weights the sampler was sent, over the
sampler's own log-probs of the tokens it drew. Loss: the token mean (DAPO's token-level normalisation) over
every completion token of -min(ratio * A, clip(ratio, low, high) * A). The bounds are (1 - eps_low, 1 + eps_high)
(symmetric 0.2 by default; DAPO's asymmetric `eps_high` 0.28 as an option), or calibrated per batch
(e2e/rl/clipping.py) when the batch carries BF16 reference ratios.

`SFTLoss` (the mean negative log-likelihood of the completion tokens) warms the random-init model up on a few
supervised batches before RL, through the same `train_step`, so RL starts from a policy that knows the format.

`PPOClipLoss` is a picklable dataclass: the loop hands it to the trainer engine (`RLTrainer.train_step`), which
calls it on its own differentiable log-probs, so any engine (the CPU learner, Megatron/TE) trains on the same
objective.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .clipping import calibrate_clip


def group_advantages(rewards: torch.Tensor, n: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each completion's reward minus its group's mean (n per prompt, prompt-major), divided by the
    group's standard deviation when `scale` (Dr. GRPO drops it). A group whose rewards are all equal gets 0."""
    r = rewards.double().view(-1, n)
    a = r - r.mean(1, keepdim=True)
    if scale:
        a = a / (r.std(1, keepdim=True, unbiased=False) + eps)
    return a.reshape(-1)


@dataclass(frozen=True)
class PPOClipLoss:
    eps_low: float = 0.2
    eps_high: float = 0.2

    def bounds(self, ratio: torch.Tensor, batch: dict) -> tuple[float, float, dict]:
        """The ratio bounds for this batch (calibrated when it carries `reference_ratios`)."""
        low, high = 1.0 - self.eps_low, 1.0 + self.eps_high
        ref = batch.get("reference_ratios")
        if ref is None:
            return low, high, {}
        mask, adv = batch["mask"], batch["advantages"]
        return calibrate_clip(ratio[mask].double(), ref[mask].double(), adv[mask].double(), low, high)

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: dict):
        """logprobs, entropy: [B, T-1] per target token of batch["sequences"]; batch["mask"] selects the
        completion tokens, batch["rollout_logprobs"] and batch["advantages"] are aligned with them.
        Returns (loss, stats); stats["logprobs"] are the learner's log-probs the ratio used (detached)."""
        mask = batch["mask"]
        adv = batch["advantages"].to(logprobs.dtype)
        ratio = torch.exp(logprobs - batch["rollout_logprobs"].to(logprobs.dtype))
        low, high, info = self.bounds(ratio.detach(), batch)
        clipped = torch.clamp(ratio, low, high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        n = mask.sum().clamp(min=1)
        loss = (per_token * mask).sum() / n
        stats = {"logprobs": logprobs.detach(), "entropy": float((entropy * mask).sum() / n),
                 "clip_low": low, "clip_high": high, **info}
        return loss, stats


@dataclass(frozen=True)
class SFTLoss:
    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: dict):
        mask = batch["mask"]
        n = mask.sum().clamp(min=1)
        return -(logprobs * mask).sum() / n, {"logprobs": logprobs.detach(), "entropy": float((entropy * mask).sum() / n)}
