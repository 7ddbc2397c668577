"""Per-tensor current scaling (TE `Float8CurrentScaling`): one scale for the whole tensor, same amax rule."""
from __future__ import annotations

import torch

from .cast import cast_to_fp8
from .constants import E4M3, FP8_MAX
from .scaling import block_amax, reciprocal, scale_from_amax


def quantize_per_tensor(x: torch.Tensor, *, amax_epsilon: float = 0.0, pow2: bool = False,
                        fp8_dtype: torch.dtype = E4M3):
    """Returns (codes like x in fp8, scale_inv fp32 shape [1])."""
    amax = block_amax(x.reshape(1, -1), (1,))
    scale = scale_from_amax(amax, FP8_MAX[fp8_dtype], pow2=pow2, amax_epsilon=amax_epsilon, input_dtype=x.dtype)
    q = cast_to_fp8(x.float() * scale, fp8_dtype)
    return q.contiguous(), reciprocal(scale)


def dequantize_per_tensor(codes: torch.Tensor, scale_inv: torch.Tensor, out_dtype=torch.float32):
    """codes * scale_inv; a stack of tensors ([E, N, K]) with one scale each ([E, 1]) scales slot by slot."""
    s = scale_inv.float()
    if s.numel() > 1 and codes.dim() > 2:
        s = s.reshape(*codes.shape[:-2], 1, 1)
    return (codes.float() * s).to(out_dtype)
