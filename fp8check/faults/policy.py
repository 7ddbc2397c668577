"""Policy faults: every byte of the sync is right and the engine still serves another policy than the learner's --
a numeric outside the weights that no byte check reads. P1, the log-prob probe, is the documented catch."""
from __future__ import annotations

from .base import Fault, register

# A sampler that returns log-probs at its sampling temperature (vLLM's processed log-probs at T = 0.8, or a model
# config's logit_scale) while the learner scores at T = 1: the importance ratio is off on every token.
register(Fault("logprobs_at_sampling_temperature", "policy", "engine", ("P1",),
               "the sampler's logits are multiplied by 1.25 before the softmax (log-probs taken at the rollout "
               "temperature 0.8, the learner's at 1): every weight byte is right, the policy is not",
               knobs={"logit_scale": 1.25}, silent=True))
