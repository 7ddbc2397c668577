"""Blockwise FP8 (DeepSeek-V3 / TE `Float8BlockScaling`): 128x128 weight blocks, 1x128 activation blocks.

Wire convention (vLLM checkpoint format): codes `[N, K]` float8, `scale_inv` float32 with the unpadded
block grid `[ceil(N/bn), ceil(K/bk)]`, dequant = codes * scale_inv.  Edge blocks are partial; padding
counts as zero for the amax, as in TE.

This is THE CPU reference (the oracle of the Triton kernel and of TE conformance).  It works in tiles of whole
blocks through one reused fp32 buffer of at most 4 MiB: the whole-tensor formulation made about seven full-size
fp32 temporaries per call and spent most of its time in page faults.
Every element still goes through the same IEEE operations (exact up-cast, NaN-skipping block max,
`scale_from_amax`, one fp32 multiply, clamp, RNE cast), so the bytes are those of the whole-tensor version
(tests/test_blockwise_chunked.py keeps it as the oracle).
"""
from __future__ import annotations

import sys

import torch

from .constants import E4M3, E4M3_NAN_BYTE, FP8_MAX, WEIGHT_BLOCK
from .scaling import block_amax, eager_only, reciprocal, scale_from_amax

# fp32 elements per work tile.  CPU: 4 MiB (smaller tiles pay more per-op overhead than they gain in cache
# hits); other devices: effectively the whole tensor (launch count matters there, memory does not).
TILE_ELEMS = {"cpu": 1 << 20}
DEFAULT_TILE_ELEMS = 1 << 28


def grid_shape(shape, block_shape=WEIGHT_BLOCK) -> tuple[int, int]:
    """Unpadded block grid of a 2D tensor: [ceil(N/bn), ceil(K/bk)]."""
    n, k = shape[-2], shape[-1]
    bn, bk = block_shape
    return (-(-n // bn), -(-k // bk))


def pad_blocks(x: torch.Tensor, block_shape):
    """Zero-pad a 2D tensor to whole blocks, viewed [gn, bn, gk, bk] (no copy when already whole)."""
    n, k = x.shape
    bn, bk = block_shape
    gn, gk = grid_shape(x.shape, block_shape)
    if (gn * bn, gk * bk) != (n, k):
        xp = torch.zeros((gn * bn, gk * bk), dtype=x.dtype, device=x.device)
        xp[:n, :k] = x
    else:
        xp = x
    return xp.reshape(gn, bn, gk, bk)


_pad_blocks = pad_blocks  # former private name


def expand_scale(scale: torch.Tensor, shape, block_shape=WEIGHT_BLOCK) -> torch.Tensor:
    """Broadcast a per-block tensor [gn, gk] to the element grid [N, K]."""
    bn, bk = block_shape
    n, k = shape
    return scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]


def _tile(x, q, s, rb, cb, fp8_dtype, pow2, eps, buf):
    """Quantize x [R, C] made of whole (rb x cb) blocks into the views q [R, C] and s [R/rb, C/cb]."""
    r, c = x.shape
    m = FP8_MAX[fp8_dtype]
    b = buf[:r * c].view(r, c)
    b.copy_(x)                                                     # exact up-cast to fp32
    v = b.view(r // rb, rb, c // cb, cb)
    # max |x| = max(max x, -min x): two reductions over the buffer, no |x| temporary.  Both propagate NaN,
    # so a NaN in the small result flags the (rare) blocks that need the NaN-skipping max.
    amax = torch.maximum(v.amax(3).amax(1), v.amin(3).amin(1).neg_())
    has_nan = bool(amax.isnan().any())
    if has_nan:
        amax = block_amax(v, (1, 3))
    scale = scale_from_amax(amax, m, pow2=pow2, amax_epsilon=eps, input_dtype=x.dtype)
    v.mul_(scale[:, None, :, None]).clamp_(-m, m)                  # y = x * scale (one fp32 rounding)
    q.copy_(b)                                                     # RNE cast, saturated by the clamp
    if has_nan:                                                    # TE writes NaN as 0x7F whatever its sign
        q.view(torch.uint8)[torch.isnan(b)] = E4M3_NAN_BYTE
    s.copy_(reciprocal(scale))


def _spans(length, block, per_tile):
    """(start, stop, block) spans: whole blocks in groups of `per_tile`, then the partial edge block."""
    whole = length // block * block
    out = [(i, min(i + per_tile * block, whole), block) for i in range(0, whole, per_tile * block)]
    if whole < length:
        out.append((whole, length, length - whole))
    return out


def _quantize_2d(x, q, s, block_shape, fp8_dtype, pow2, eps):
    n, k = x.shape
    bn, bk = block_shape
    budget = TILE_ELEMS.get(x.device.type, DEFAULT_TILE_ELEMS)
    cols_per = max(1, min(-(-k // bk), budget // (bn * bk)))       # block columns per tile
    rows_per = max(1, budget // (bn * bk * cols_per))               # block rows per tile
    buf = torch.empty(min(n, rows_per * bn) * min(k, cols_per * bk), dtype=torch.float32, device=x.device)
    for r0, r1, rb in _spans(n, bn, rows_per):
        for c0, c1, cb in _spans(k, bk, cols_per):
            _tile(x[r0:r1, c0:c1], q[r0:r1, c0:c1], s[r0 // bn:-(-r1 // bn), c0 // bk:-(-c1 // bk)],
                  rb, cb, fp8_dtype, pow2, eps, buf)


@eager_only
def quantize_blockwise(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False,
                       amax_epsilon: float = 0.0, fp8_dtype: torch.dtype = E4M3):
    """Mirror of TE's blockwise quantizer. Returns (codes [N, K] fp8, scale_inv [gn, gk] fp32).

    Leading dims (experts) are quantized independently per 2D slice.  Never compiled (`eager_only`):
    inductor rewrites `448 / amax` into a reciprocal-multiply, one ulp off TE.
    """
    if x.dim() < 2:
        raise ValueError(f"quantize_blockwise expects a 2D tensor, got shape {tuple(x.shape)}")
    n, k = x.shape[-2:]
    gn, gk = grid_shape(x.shape, block_shape)
    q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    s = torch.empty((*x.shape[:-2], gn, gk), dtype=torch.float32, device=x.device)
    if x.dim() == 2:
        _quantize_2d(x, q, s, block_shape, fp8_dtype, pow2, amax_epsilon)
    else:
        for xi, qi, si in zip(x.reshape(-1, n, k), q.view(-1, n, k), s.view(-1, gn, gk)):
            _quantize_2d(xi, qi, si, block_shape, fp8_dtype, pow2, amax_epsilon)
    return q, s


def dequantize_blockwise(codes: torch.Tensor, scale_inv: torch.Tensor, block_shape=WEIGHT_BLOCK,
                         out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes * scale_inv, broadcast over blocks; leading (expert) dims allowed."""
    if codes.dim() > 2 and codes.shape[-2] % block_shape[0] == 0 and codes.shape[-1] % block_shape[1] == 0 \
            and tuple(scale_inv.shape) == (*codes.shape[:-2], *grid_shape(codes.shape, block_shape)):
        # whole blocks: every expert in one broadcast (the same multiplies as one expert at a time)
        *lead, n, k = codes.shape
        bn, bk = block_shape
        c = to_float(codes)
        y = _scaled(c, codes, c.view(*lead, n // bn, bn, k // bk, bk), scale_inv.float()[..., :, None, :, None])
        return y.view(codes.shape).to(out_dtype)
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
        y = _scaled(c, codes, c.view(n // bn, bn, k // bk, bk), scale_inv.float()[:, None, :, None]).view(n, k)
    else:
        y = _scaled(c, codes, c, expand_scale(scale_inv.float(), codes.shape, block_shape))
    return y.to(out_dtype)


def _scaled(c: torch.Tensor, codes: torch.Tensor, view: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """view * scale, in place when `c` (whose view it is) is a fresh up-cast of `codes` (one fp32 copy of the
    weight instead of two: P1 dequantizes every FP8 weight of the model on the GPU); the same fp32 multiplies."""
    if c.data_ptr() != codes.data_ptr() and c.is_contiguous():
        return view.mul_(scale)
    return view * scale


_LUT: dict = {}
_PAIRS: dict = {}


def _byte_table(dtype: torch.dtype) -> torch.Tensor:
    """Every fp8 byte -> its fp32 value (the cast's own bits)."""
    lut = _LUT.get(dtype)
    if lut is None:
        lut = _LUT[dtype] = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return lut


def _pair_table(dtype: torch.dtype) -> torch.Tensor:
    """Every two consecutive fp8 bytes (read as one little-endian int16) -> their two fp32 values as one int64
    word: one table lookup per two elements (a 512 KiB table)."""
    table = _PAIRS.get(dtype)
    if table is None:
        lut = _byte_table(dtype)
        i = torch.arange(1 << 16, dtype=torch.int32)
        table = _PAIRS[dtype] = torch.stack([lut[i & 0xFF], lut[i >> 8]], 1).contiguous().view(torch.int64).reshape(-1)
    return table


def to_float(t: torch.Tensor) -> torch.Tensor:
    """fp8 -> fp32 through a table on the host (exact, the table holds the cast's own bits; 7x faster than the CPU
    cast kernel: 1024x512, 200 us vs 1630 us): two bytes at a time where the bytes are contiguous and even in
    number and offset, one at a time otherwise; other devices cast."""
    if t.element_size() != 1 or t.dtype == torch.uint8 or t.device.type != "cpu":
        return t.float()
    n = t.numel()
    if n and n % 2 == 0 and t.is_contiguous() and t.storage_offset() % 2 == 0 and sys.byteorder == "little":
        pairs = t.reshape(-1).view(torch.uint8).view(torch.uint16).int()
        return _pair_table(t.dtype).index_select(0, pairs).view(torch.float32).reshape(t.shape)
    return _byte_table(t.dtype).index_select(0, t.reshape(-1).view(torch.uint8).long()).reshape(t.shape)
