"""Blockwise FP8 (DeepSeek-V3 / TE `Float8BlockScaling`): 128x128 weight blocks, 1x128 activation blocks.

Wire convention (vLLM checkpoint format): codes `[N, K]` float8, `scale_inv` float32 with the unpadded
block grid `[ceil(N/bn), ceil(K/bk)]`, dequant = codes * scale_inv.  Edge blocks are partial; padding
counts as zero for the amax, as in TE.
"""
from __future__ import annotations

import torch

from .cast import cast_to_fp8
from .constants import E4M3, FP8_MAX, WEIGHT_BLOCK
from .scaling import block_amax, reciprocal, scale_from_amax


def grid_shape(shape, block_shape=WEIGHT_BLOCK) -> tuple[int, int]:
    """Unpadded block grid of a 2D tensor: [ceil(N/bn), ceil(K/bk)]."""
    n, k = shape[-2], shape[-1]
    bn, bk = block_shape
    return (-(-n // bn), -(-k // bk))


def _pad_blocks(x: torch.Tensor, block_shape):
    n, k = x.shape
    bn, bk = block_shape
    gn, gk = grid_shape(x.shape, block_shape)
    if (gn * bn, gk * bk) != (n, k):
        xp = torch.zeros((gn * bn, gk * bk), dtype=x.dtype, device=x.device)
        xp[:n, :k] = x
    else:
        xp = x
    return xp.reshape(gn, bn, gk, bk)


def expand_scale(scale: torch.Tensor, shape, block_shape=WEIGHT_BLOCK) -> torch.Tensor:
    """Broadcast a per-block tensor [gn, gk] to the element grid [N, K]."""
    bn, bk = block_shape
    n, k = shape
    return scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]


def quantize_blockwise(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False,
                       amax_epsilon: float = 0.0, fp8_dtype: torch.dtype = E4M3):
    """Mirror of TE's blockwise quantizer. Returns (codes [N, K] fp8, scale_inv [gn, gk] fp32).

    Leading dims (experts) are quantized independently per 2D slice.
    """
    if x.dim() > 2:
        parts = [quantize_blockwise(s, block_shape, pow2=pow2, amax_epsilon=amax_epsilon, fp8_dtype=fp8_dtype)
                 for s in x.reshape(-1, *x.shape[-2:])]
        q = torch.stack([p[0] for p in parts]).reshape(x.shape)
        s = torch.stack([p[1] for p in parts]).reshape(*x.shape[:-2], *parts[0][1].shape)
        return q, s
    if x.dim() != 2:
        raise ValueError(f"quantize_blockwise expects a 2D tensor, got shape {tuple(x.shape)}")
    n, k = x.shape
    xb = _pad_blocks(x, block_shape)                                   # [gn, bn, gk, bk] input dtype
    amax = block_amax(xb, (1, 3))                                      # [gn, gk] fp32
    scale = scale_from_amax(amax, FP8_MAX[fp8_dtype], pow2=pow2, amax_epsilon=amax_epsilon,
                            input_dtype=x.dtype)
    y = xb.float() * scale[:, None, :, None]
    q = cast_to_fp8(y, fp8_dtype).reshape(xb.shape[0] * xb.shape[1], xb.shape[2] * xb.shape[3])[:n, :k]
    return q.contiguous(), reciprocal(scale).contiguous()


def dequantize_blockwise(codes: torch.Tensor, scale_inv: torch.Tensor, block_shape=WEIGHT_BLOCK,
                         out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes * scale_inv, broadcast over blocks; leading (expert) dims allowed."""
    if codes.dim() > 2:
        flat = codes.reshape(-1, *codes.shape[-2:])
        sflat = scale_inv.reshape(-1, *scale_inv.shape[-2:])
        out = torch.stack([dequantize_blockwise(c, s, block_shape, out_dtype) for c, s in zip(flat, sflat)])
        return out.reshape(codes.shape)
    if tuple(scale_inv.shape) != grid_shape(codes.shape, block_shape):
        raise ValueError(f"scale_inv shape {tuple(scale_inv.shape)} is not the block grid "
                         f"{grid_shape(codes.shape, block_shape)} of codes {tuple(codes.shape)}")
    n, k = codes.shape
    bn, bk = block_shape
    c = to_float(codes)
    if n % bn == 0 and k % bk == 0:          # whole blocks: broadcast instead of materializing the scale grid
        y = (c.view(n // bn, bn, k // bk, bk) * scale_inv.float()[:, None, :, None]).view(n, k)
    else:
        y = c * expand_scale(scale_inv.float(), codes.shape, block_shape)
    return y.to(out_dtype)


_LUT: dict = {}


def to_float(t: torch.Tensor) -> torch.Tensor:
    """fp8 -> fp32 through a 256-entry table (exact; faster than the CPU cast kernel)."""
    if t.element_size() != 1 or t.dtype == torch.uint8:
        return t.float()
    lut = _LUT.get(t.dtype)
    if lut is None:
        lut = _LUT[t.dtype] = torch.arange(256, dtype=torch.uint8).view(t.dtype).float()
    return lut.index_select(0, t.reshape(-1).view(torch.uint8).int()).reshape(t.shape)


pad_blocks = _pad_blocks     # public name: [N, K] -> [gn, bn, gk, bk] zero-padded block view
