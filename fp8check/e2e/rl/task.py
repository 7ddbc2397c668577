"""The RL task: transform a short digit string (copy, reverse or sort it), reward computed exactly.

Tokens (the `tiny-rl` model's vocabulary of 128; the rest are never right): PAD 0, BOS 1, EOS 2, SEP 3, digits
0-9 as tokens 4-13. A prompt is `BOS d1 .. dL SEP`; the right completion is the transformed digits, then EOS.
Reward: the fraction of positions holding the right digit, over the longer of the answer and the completion
(cut at EOS; a completion without EOS counts all its tokens), so 1.0 is exactly the right answer and stopping
on time is part of it. Prompts are drawn from a generator seeded per (seed, step): every arm sees the same ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, EOS, SEP = 0, 1, 2, 3
DIGIT0 = 4
TASKS = ("copy", "reverse", "sort")


@dataclass(frozen=True)
class DigitTask:
    name: str = "copy"
    length: int = 4                    # digits per prompt

    def __post_init__(self):
        if self.name not in TASKS:
            raise ValueError(f"task {self.name!r}: choose one of {', '.join(TASKS)}")
        if self.length < 1:
            raise ValueError(f"task length {self.length}: must be >= 1")

    @property
    def max_tokens(self) -> int:
        """Room for the answer and its EOS."""
        return self.length + 1

    def answer(self, digits: list[int]) -> list[int]:
        if self.name == "reverse":
            return digits[::-1]
        if self.name == "sort":
            return sorted(digits)
        return list(digits)

    def prompts(self, count: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        digits = torch.randint(0, 10, (count, self.length), generator=g).tolist()
        return [[BOS] + [DIGIT0 + d for d in ds] + [SEP] for ds in digits]

    def digits_of(self, prompt: list[int]) -> list[int]:
        return [t - DIGIT0 for t in prompt[1:-1]]

    def reward(self, prompt: list[int], completion: list[int]) -> float:
        want = [DIGIT0 + d for d in self.answer(self.digits_of(prompt))]
        got = completion[:completion.index(EOS)] if EOS in completion else list(completion)
        right = sum(a == b for a, b in zip(want, got))
        return right / max(len(want), len(got))

    def supervised(self, prompts: list[list[int]]) -> dict:
        """A warm-up batch: each prompt followed by its right answer and EOS, the answer tokens masked in."""
        seqs = torch.tensor([p + [DIGIT0 + d for d in self.answer(self.digits_of(p))] + [EOS] for p in prompts])
        mask = torch.zeros(seqs.shape[0], seqs.shape[1] - 1, dtype=torch.bool)
        mask[:, len(prompts[0]) - 1:] = True
        return {"sequences": seqs, "mask": mask, "temperature": 1.0}

    def rewards(self, prompts: list[list[int]], tokens: torch.Tensor, n: int) -> torch.Tensor:
        """Rewards of [B, max_tokens] completions, n per prompt (prompt-major)."""
        return torch.tensor([self.reward(prompts[i // n], row) for i, row in enumerate(tokens.tolist())],
                            dtype=torch.float64)
