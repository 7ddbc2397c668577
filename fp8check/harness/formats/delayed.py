"""Transformer Engine's delayed scaling (`recipe.DelayedScaling`), per tensor, as TE 2.20 runs it for one
quantizer slot (a te.Linear's weight, or its input):

* state: `scale` fp32 (starts at 1.0) and `amax_history` fp32 [L] (starts at zeros)
  (transformer_engine/pytorch/quantization.py:1436-1449);
* a cast quantizes with the scale it finds -- computed before this forward, so the first forward runs at scale
  1.0 -- as codes = e4m3(saturate(x * scale)) (a fp32 multiply, round to nearest even, clamped to +-448), writes
  scale_inv = 1 / scale (fp32, correctly rounded) and records amax(|x|) into amax_history[0] as a running max
  (common/util/vectorized_pointwise.h:188-224, transpose/cast_transpose.cu);
* at the outermost fp8_autocast exit with gradients enabled, the update (common/recipe/delayed_scaling.cu
  kernel_bulk): when history[0] != 0 the history rolls (slot 0 zeroed, slot i <- slot i+1, the newest amax to
  the last slot); the amax is the newest (`most_recent`) or the window's max (`max`); scale = 448 * 2^-margin /
  amax when that amax is finite and > 0, else the old scale; an infinite scale becomes FLT_MAX.

Megatron-Core 0.19.2's `fp8_recipe="delayed"` is margin 0, amax_history_len 1, `most_recent`
(megatron/core/transformer/transformer_config.py:592-603); it casts each weight once per step
(`is_first_microbatch`), so a step's weight codes use the scale computed from the previous step's weight.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cast import cast_to_fp8
from .constants import E4M3, FP8_MAX

AMAX_COMPUTE_ALGOS = ("most_recent", "max")
FLT_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class DelayedScaling:
    """The recipe's knobs (TE's DelayedScaling fields; Megatron-Core's defaults)."""
    margin: int = 0
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"

    def __post_init__(self):
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_COMPUTE_ALGOS}, got {self.amax_compute_algo!r}")
        if not (isinstance(self.amax_history_len, int) and self.amax_history_len >= 1):
            raise ValueError(f"amax_history_len must be an integer >= 1, got {self.amax_history_len!r}")

    def state(self) -> "DelayedState":
        return DelayedState(torch.ones(1), torch.zeros(self.amax_history_len))


@dataclass
class DelayedState:
    """One quantizer slot's scale and amax history."""
    scale: torch.Tensor
    amax_history: torch.Tensor

    def observe(self, x: torch.Tensor):
        """What a cast records: amax(|x|) into history[0], as a running max until the next update."""
        xf = x.detach().float()
        amax = xf.abs().amax() if xf.numel() else torch.zeros(())
        self.amax_history[0] = torch.maximum(self.amax_history[0], amax)

    def cast(self, x: torch.Tensor, fp8_dtype=E4M3, record: bool = True):
        """(codes like x, scale_inv [1]) with the current scale; records amax(|x|) into history[0] (record=False:
        the same codes without touching the state, for a read that must not change the learner)."""
        codes = cast_to_fp8(x.detach().float() * self.scale, fp8_dtype)     # saturating, round to nearest even
        if record:
            self.observe(x)
        return codes, torch.reciprocal(self.scale.clone())

    def update(self, recipe: DelayedScaling, fp8_dtype=E4M3):
        """The autocast exit's amax-and-scale update for this slot."""
        h = self.amax_history
        last = float(h[0])
        if last == 0.0:
            return                                   # nothing recorded since the last update: no roll, same scale
        window = torch.cat([h[1:], h[:1]])           # slot i <- slot i+1; the newest amax last
        amax = torch.tensor(last) if recipe.amax_compute_algo == "most_recent" else window.max()
        rolled = window.clone()
        rolled[0] = 0.0                              # the kernel writes slot 0 as 0 (L = 1: the whole history)
        self.amax_history = rolled
        if torch.isfinite(amax) and float(amax) > 0:
            scaled_max = torch.tensor(FP8_MAX[fp8_dtype] * 2.0 ** -recipe.margin, dtype=torch.float32)
            s = (scaled_max / amax.float()).reshape(1)
            self.scale = torch.where(torch.isinf(s), torch.full_like(s, FLT_MAX), s)


__all__ = ["AMAX_COMPUTE_ALGOS", "DelayedScaling", "DelayedState"]
