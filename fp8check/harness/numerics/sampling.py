"""Autoregressive sampling on the reference forward (harness.numerics.forward), for a rollout engine that serves
generation from the weights it holds (the CPU reference rollout's `sample`).

Every prompt is sampled `n` times (prompt-major: the n samples of prompt 0 first). Tokens are drawn by the
Gumbel-max trick from one seeded generator, so two engines given the same seed draw the same noise: their
samples differ only where their distributions do (common random numbers, which makes paired comparisons
between arms sharp). Decoding keeps a KV cache (full-attention models; others recompute the prefix); the
log-prob recorded for a token is the one of the distribution it was drawn from (logits / temperature, vLLM's
`logprobs_mode="processed_logprobs"`); temperature 0 is greedy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import ModelSpec
from .forward import Weights, logits


@dataclass
class Samples:
    """n completions per prompt. tokens / logprobs: [B, max_tokens] (B = prompts x n, prompt-major); after a
    completion's stop token the row holds `pad` and log-prob 0. lengths: tokens generated, the stop token
    included (max_tokens when it never came)."""
    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "logprobs": self.logprobs, "lengths": self.lengths}


def sample(spec: ModelSpec, W: Weights, prompts: list[list[int]], n: int, max_tokens: int, temperature: float = 1.0,
           seed: int = 0, stop_token: int | None = None, pad: int = 0) -> Samples:
    if not prompts or len({len(p) for p in prompts}) != 1:
        raise ValueError("sample: prompts must be a non-empty list of equal-length token lists")
    if n < 1 or max_tokens < 1 or temperature < 0:
        raise ValueError(f"sample: n {n} and max_tokens {max_tokens} must be >= 1, temperature {temperature} >= 0")
    seqs = torch.tensor(prompts, dtype=torch.long).repeat_interleave(n, 0)
    B, L = seqs.shape
    g = torch.Generator().manual_seed(seed)
    lps = torch.zeros(B, max_tokens)
    lengths = torch.full((B,), max_tokens, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    cache = {} if all(lt == "full_attention" for lt in spec.layer_types) else None
    with torch.no_grad():
        for t in range(max_tokens):
            step_in = seqs if cache is None or t == 0 else seqs[:, -1:]
            lg = logits(spec, W, step_in, cache)[:, -1]
            u = torch.rand(lg.shape, generator=g).clamp_(min=1e-20)   # drawn every step: same noise per seed
            if temperature == 0:
                lp = lg.log_softmax(-1)
                tok = lg.argmax(-1)
            else:
                lp = (lg / temperature).log_softmax(-1)
                tok = (lp - torch.log(-torch.log(u))).argmax(-1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            lps[:, t] = torch.where(done, torch.zeros(B), lp.gather(-1, tok[:, None])[:, 0])
            seqs = torch.cat([seqs, tok[:, None]], 1)
            if stop_token is not None:
                ended = ~done & (tok == stop_token)
                lengths[ended] = t + 1
                done |= ended
                if bool(done.all()):
                    break
    gen = seqs[:, L:]
    if gen.shape[1] < max_tokens:
        gen = torch.cat([gen, torch.full((B, max_tokens - gen.shape[1]), pad, dtype=torch.long)], 1)
    return Samples(gen, lps, lengths)
