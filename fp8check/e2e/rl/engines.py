"""What the RL loop asks of its engines beyond the engine protocol (harness/engines/protocol.py): a trainer that
takes one RL update and a rollout engine that samples. Every sync still goes through the protocol and the one
pipeline; these two methods are the only additions, so a Megatron/TE trainer and a vLLM rollout plug in by
implementing them (the CPU learner, harness/engines/cpu/learner.py, and the CPU reference rollout,
harness/engines/cpu/rollout.py, do).

RLTrainer.train_step(batch: dict, loss) -> dict
    One RL update on the learner's FP8 policy. `batch` (plain tensors, so it crosses the remote wrapper's wire):
      sequences         LongTensor  [B, T]    prompt + completion tokens (all prompts of one length; PAD after
                                              a completion's stop token)
      mask              BoolTensor  [B, T-1]  target positions t (predicting sequences[:, t+1]) that are
                                              completion tokens, the stop token included
      rollout_logprobs  FloatTensor [B, T-1]  the sampler's log-prob of each target token (0 off the mask)
      advantages        FloatTensor [B, T-1]  the completion's advantage on its tokens (0 off the mask)
      temperature       float                 log-probs are those of logits / temperature
      reference_ratios  FloatTensor [B, T-1]  optional: BF16 shadow ratios (calibrated clipping)
    The engine computes, with its FP8 forward (exactly the bytes `export_hf` returns, activations quantized as
    its recipe does), differentiable per-target log-probs lp [B, T-1] of `sequences` and the policy entropy per
    target (no gradient), calls `value, stats = loss(lp, entropy, batch)` (e2e.rl.loss.PPOClipLoss: a picklable
    callable), runs `value.backward()`, clips the gradient norm (the engine's setting) and takes exactly one
    optimizer step (AdamW) with `optimizer_step` semantics: the version goes up by one and `export_hf`,
    `master_hf` and `logprobs` then describe the new weights. Returns `stats` (with stats["logprobs"], the
    detached lp the ratio used) plus "loss", "grad_norm" (before clipping) and "version".

RLRollout.sample(prompts: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 stop_token: int | None) -> dict
    n completions of every prompt (prompt-major: B = len(prompts) * n) from the policy the engine serves now --
    its installed kernel tensors, never the trainer's -- each ending at `stop_token` or after `max_tokens`;
    refused (EngineError) while an update is being installed. Returns {"tokens": LongTensor [B, max_tokens]
    (PAD after the stop token), "logprobs": FloatTensor [B, max_tokens] (the log-prob of each drawn token under
    the distribution it was drawn from, logits / temperature -- vLLM: SamplingParams(n, max_tokens, temperature,
    seed, logprobs=0, stop_token_ids=[stop_token]) with logprobs_mode="processed_logprobs"; 0 after the stop
    token), "lengths": LongTensor [B] (tokens generated, the stop token included)}. One seed draws one stream of
    noise, so engines given the same seed draw the same samples where their distributions agree.
"""
from __future__ import annotations

from typing import Protocol

from fp8check.harness.engines.protocol import RolloutEngine, TrainerEngine
from fp8check.harness.engines.registry import get_engine, make_engine
from fp8check.harness.kinds import Precision, Quantization

RL_REQUIRED = {"trainer": ("train_step",), "rollout": ("sample",)}
# the engines each --engine choice runs, by registered name
ENGINE_SETS = {"cpu": {"trainer": "cpu-learner", "rollout": "cpu-reference"},
               "live": {"trainer": "megatron", "rollout": "vllm"}}


class RLTrainer(TrainerEngine, Protocol):
    def train_step(self, batch: dict, loss) -> dict: ...


class RLRollout(RolloutEngine, Protocol):
    def sample(self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
               stop_token: int | None) -> dict: ...


def missing_rl_surface(engines: str = "cpu") -> list[str]:
    """`kind name.method` for each RL method a registered engine of the set lacks (checked on its class)."""
    out = []
    for kind, name in ENGINE_SETS[engines].items():
        factory = get_engine(kind, name).factory
        out += [f"{kind} {name}.{m}" for m in RL_REQUIRED[kind] if not callable(getattr(factory, m, None))]
    return out


def unsupported(config, engines: str = "cpu") -> list[str]:
    """What the engine set cannot run of `config`, one phrase each: a trainer declares the `trainer.precision`
    values it runs (`precisions`), a rollout engine the `rollout.quantization` values (`quantizations`); an engine
    that declares neither runs the defaults only (an FP8 learner on its recipe, a checkpoint engine)."""
    out = []
    for kind, setting, attr, default in (("trainer", config.trainer.precision, "precisions", Precision.FP8),
                                         ("rollout", config.rollout.quantization, "quantizations",
                                          Quantization.CHECKPOINT)):
        name = ENGINE_SETS[engines][kind]
        have = getattr(get_engine(kind, name).factory, attr, (default,))
        if setting not in have:
            out.append(f"{kind} {name} runs {attr[:-1]} {', '.join(have)}, not {setting}")
    return out


def build_engines(config, engines: str = "cpu", trainer_kwargs: dict | None = None, rollout_kwargs: dict | None = None,
                  num_gpus: float = 0.3):
    """(trainer, rollout, owned) for one arm: in this process on CPU; behind the remote wrapper as Ray actors
    for `live` (the engines `fp8check live` runs). `owned`: what the caller must close."""
    names = ENGINE_SETS[engines]
    if engines == "cpu":
        return (make_engine("trainer", names["trainer"], config, **(trainer_kwargs or {})),
                make_engine("rollout", names["rollout"], config, **(rollout_kwargs or {})), [])
    from fp8check.harness.engines.remote import Remote
    owned = []
    try:
        for kind, kw in (("trainer", trainer_kwargs), ("rollout", rollout_kwargs)):
            owned.append(Remote(kind, names[kind], config, ray=True, num_gpus=num_gpus, **(kw or {})))
    except BaseException:
        for e in owned:
            e.close()
        raise
    return owned[0], owned[1], owned
