"""MXFP8 (OCP microscaling): 1x32 blocks along the reduction dim, E8M0 shared exponents.

Exponent rule (TE common/util/ptx.cuh `float_to_e8m0` and the MXFP8 cast kernels):
  e = biased exponent of fl(amax * fl(1/448)) rounded *up* to a power of two (any mantissa bit -> e + 1),
      saturating at 0xFE; NaN -> 0xFF.  The block's decode scale is 2^(e - 127).
  codes = e4m3(x * 2^(127 - e)) with saturation; the encode factor for e == 0 is 1 in TE (`exp2f_rcp`).
  All-zero block: amax 0 -> e = 0x00 (decode scale 2^-127, codes 0).
MXFP8 GEMMs need sm100 (Blackwell): on Hopper this file is exact on CPU only.
"""
from __future__ import annotations

import torch

from .blockwise import to_float
from .cast import cast_to_fp8
from .constants import E4M3, E8M0, MX_BLOCK
from .scaling import block_amax

_RCP = {E4M3: torch.tensor(1.0 / 448.0, dtype=torch.float32).item()}


def float_to_e8m0(v: torch.Tensor) -> torch.Tensor:
    """fp32 >= 0 -> E8M0 byte (uint8), rounding the exponent up, TE's software fallback rule."""
    bits = v.float().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + round_up.to(torch.int32)
    e = torch.where(torch.isnan(v), torch.full_like(e, 0xFF), e)
    e = torch.where(torch.isinf(v), torch.full_like(e, 0xFE), e)
    return e.to(torch.uint8)


def e8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """Decode scale 2^(e - 127) as fp32 (0xFF -> NaN). Exact for e in 1..254; e == 0 gives 2^-127."""
    e = e.view(torch.uint8).to(torch.int32)
    out = torch.exp2((e - 127).float())
    return torch.where(e == 0xFF, torch.full_like(out, float("nan")), out)


def _encode_factor(e: torch.Tensor) -> torch.Tensor:
    """TE `exp2f_rcp`: 2^(127 - e) as fp32, 1 for e == 0."""
    e = e.to(torch.int32)
    f = ((254 - e).clamp(min=0) << 23).view(torch.float32)
    return torch.where(e == 0, torch.ones_like(f), f)


def quantize_mxfp8(x: torch.Tensor, fp8_dtype: torch.dtype = E4M3, block: int = MX_BLOCK):
    """Rowwise MXFP8. Returns (codes [N, K] fp8, scale [N, ceil(K/32)] float8_e8m0fnu)."""
    if x.dim() > 2:
        parts = [quantize_mxfp8(s, fp8_dtype, block) for s in x.reshape(-1, *x.shape[-2:])]
        q = torch.stack([p[0] for p in parts]).reshape(x.shape)
        s = torch.stack([p[1] for p in parts]).reshape(*x.shape[:-2], *parts[0][1].shape)
        return q, s
    n, k = x.shape
    gk = -(-k // block)
    if k % block:
        xp = torch.zeros((n, gk * block), dtype=x.dtype, device=x.device)
        xp[:, :k] = x
    else:
        xp = x
    xb = xp.reshape(n, gk, block)
    amax = xb.abs().amax(2).float()
    # the plain max propagates NaN: a NaN in its small result flags the (rare) rows that need the NaN-skipping one
    if amax.device.type != "cpu" or bool(amax.isnan().any()):
        amax = block_amax(xb, (2,))
    e = float_to_e8m0(amax * _RCP[fp8_dtype])
    y = xb.float() * _encode_factor(e)[:, :, None]
    q = cast_to_fp8(y, fp8_dtype).reshape(n, gk * block)[:, :k]
    return q.contiguous(), e.view(E8M0).contiguous()


def dequantize_mxfp8(codes: torch.Tensor, scale: torch.Tensor, block: int = MX_BLOCK,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    k = codes.shape[-1]
    s = e8m0_to_float(scale)
    c = to_float(codes)                                # the table, not the CPU cast kernel: same values, 5x faster
    if k % block == 0 and tuple(s.shape) == (*c.shape[:-1], k // block) and c.data_ptr() != codes.data_ptr() \
            and c.is_contiguous():
        # whole blocks: the scales broadcast over a fresh up-cast, in place (the same multiplies)
        return c.view(*c.shape[:-1], k // block, block).mul_(s[..., None]).view(c.shape).to(out_dtype)
    return (c * s.repeat_interleave(block, -1)[..., :k]).to(out_dtype)


