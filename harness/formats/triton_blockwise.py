"""Blockwise FP8 quantizer as one Triton kernel, byte-identical to `harness.formats.quantize_blockwise`.

Same signature, semantics and wire layout as the CPU reference (codes [.., N, K], scale_inv [.., gn, gk], leading
expert dims per 2D slice); tests/test_triton_quantizer.py (interpreter) and tests/gpu/test_triton_conformance.py
(H200, against TE too) prove the bytes.  One program per block (128x128) or per ROWS rows of 1xBK blocks: the tile
is read once, reduced, scaled and written; no temporaries.

Why each step is exact on sm90 as well as under TRITON_INTERPRET=1:
* Inputs are loaded as raw integers.  bf16 -> fp32 is `bits << 16`; fp16 -> fp32 is the hardware `cvt.f32.f16`
  (exact, subnormals kept); amax is an integer max of |bits| with NaN bit patterns replaced by 0 (for
  non-negative floats integer order is float order), so no float max/NaN semantics are involved.
* Both divisions are `tl.math.div_rn` (PTX `div.rn.f32`, IEEE round-to-nearest, no ftz).  A plain `/` is
  `div.full.f32` on the GPU (about 2 ulp) but exact in the interpreter, so tests check the source for it.
* y = x * scale is one fp32 `mul` with nothing to contract it into an FMA (its only consumer is a bitcast);
  Triton sets no flush-to-zero for it (libdevice ftz does not apply: no libdevice call is made).
* The fp8 cast, on the GPU, is the hardware's `cvt.rn.satfinite.e4m3x2.f32` (`.to(tl.float8e4nv)`, round to
  nearest even, saturating to +-448: the conversion TE's own kernels run, `__nv_cvt_float_to_fp8(.., SATFINITE)`),
  with NaN written as 0x7F whatever its sign.  Under the interpreter it is an integer round-to-nearest-even encoder
  with the same results (`_fp8_encode`), because the interpreter's float8 conversion (triton 3.6
  `interpreter._convert_float`) rounds ties away from zero, does not saturate and mis-encodes NaN and fp8
  subnormals (1.0625 -> 0x39, 500 -> 0x78, NaN -> 0x7C, 1.5 * 2^-9 -> 0x01).  The integer encoder costs about 20
  integer operations per element, which bounded the kernel at about 870 GB/s of input on the H200 (0.43 of a copy):
  the compute, not the memory.  The sm90 PTX of both builds is checked in tests/test_triton_quantizer.py; the GPU
  build's bytes against TE's on the H200 (tests/gpu/test_triton_conformance.py).
"""
from __future__ import annotations

import torch

from .blockwise import grid_shape
from .constants import E4M3, E4M3_NAN_BYTE, E5M2, INPUT_DTYPE_MAX, WEIGHT_BLOCK

try:
    import triton
    import triton.language as tl
except ImportError as _e:          # CPU machines without Triton still import harness.formats
    triton = tl = None
    _IMPORT_ERROR = _e

# fp8 format: (mantissa bits, exponent bias, largest finite value, its code)
_FORMATS = {E4M3: (3, 7, 448.0, 0x7E), E5M2: (2, 15, 57344.0, 0x7B)}

if triton is not None:
    @triton.jit
    def _fp8_encode(bits, MANT: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr,
                    MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr):
        """fp32 bit patterns (int32) -> fp8 codes (int32 0..255): RNE, saturate to +-max, NaN -> NAN_CODE."""
        sign = (bits >> 24) & 0x80
        a = bits & 0x7FFFFFFF
        e = a >> 23
        # normal fp8 range: rebias the exponent and round the mantissa at bit 23-MANT (carry may bump the exponent)
        normal = (a - ((127 - BIAS) << 23) + ((1 << (22 - MANT)) - 1) + ((a >> (23 - MANT)) & 1)) >> (23 - MANT)
        # fp8 subnormals: units of 2^(1-BIAS-MANT); shift the 24-bit significand, round half to even
        shift = tl.minimum(tl.maximum((150 - BIAS - MANT + 1) - e, 1), 25)
        sig = (a & 0x7FFFFF) | 0x800000
        q = sig >> shift
        rem = sig & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
        mag = tl.where(e >= 127 - BIAS + 1, normal, q)
        mag = tl.where(a >= MAX_BITS, MAX_CODE, mag)
        return tl.where(a > 0x7F800000, NAN_CODE, sign | mag)

    @triton.jit
    def _fp8_codes(y, HW_CAST: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr,
                   MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr):
        """fp32 values -> fp8 codes (uint8): RNE, saturating, NaN -> NAN_CODE (see the module docstring)."""
        if HW_CAST:
            if MANT == 3:
                h = y.to(tl.float8e4nv, fp_downcast_rounding="rtne")
            else:
                h = y.to(tl.float8e5, fp_downcast_rounding="rtne")
            return tl.where(y != y, NAN_CODE, h.to(tl.uint8, bitcast=True).to(tl.int32)).to(tl.uint8)
        return _fp8_encode(y.to(tl.int32, bitcast=True), MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE).to(tl.uint8)

    @triton.jit
    def _load_bits(x_tile, r, c_in, row0, N, K, col0, sxn, sxk, ROW_OK, IN_KIND: tl.constexpr, BK: tl.constexpr):
        """fp32 bit patterns (int32) of tile rows r (a vector) x columns c_in; outside the tensor: 0."""
        mask = (ROW_OK & (row0 + r < N))[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :]
        raw = tl.load(x_tile + (r[:, None] * sxn + c_in[None, :] * sxk), mask=mask, other=0)
        if IN_KIND == 0:      # bf16 bits -> fp32 bits
            bits = raw.to(tl.int32) << 16
        elif IN_KIND == 1:    # fp16 -> fp32, exact hardware conversion
            bits = raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        else:                 # fp32
            bits = raw
        return bits, mask

    @triton.jit
    def _abs_bits(bits):
        ab = bits & 0x7FFFFFFF
        return tl.where(ab > 0x7F800000, 0, ab)               # NaN skipped (as 0)

    @triton.jit
    def _scale(amax_bits, eps, USE_EPS: tl.constexpr, POW2: tl.constexpr, FP8_MAX: tl.constexpr,
               INPUT_MAX: tl.constexpr):
        """TE's compute_scale_from_amax on |x| bit patterns -> (scale, scale_inv)."""
        amax = amax_bits.to(tl.float32, bitcast=True)
        if USE_EPS:
            amax = tl.where(amax < eps, eps, amax)
        scale = tl.math.div_rn(tl.full(amax.shape, FP8_MAX, tl.float32), amax)
        scale = tl.where(scale.to(tl.int32, bitcast=True) == 0x7F800000, INPUT_MAX, scale)   # overflow
        abits = amax.to(tl.int32, bitcast=True)
        scale = tl.where((abits == 0) | (abits >= 0x7F800000), 1.0, scale)                    # amax 0 / inf
        if POW2:
            scale = (scale.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)
        return scale, tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)

    @triton.jit
    def _blockwise_kernel(x_ptr, q_ptr, s_ptr, N, K, sxb, sxn, sxk, gn, gk, row_tiles, eps,
                          IN_KIND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          ROWS: tl.constexpr, SUB: tl.constexpr, BK_P2: tl.constexpr,
                          POW2: tl.constexpr, USE_EPS: tl.constexpr, FP8_MAX: tl.constexpr,
                          INPUT_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                          MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                          HW_CAST: tl.constexpr):
        """One program: ROWS rows x BK columns.  BN == 1: ROWS blocks of one row, one pass.  BN > 1 (ROWS == BN):
        one block, either read in SUB-row slices twice (amax, then quantize; the second read hits L1/L2: a whole
        128x128 tile in registers spills at 8 warps) or, with SUB == ROWS, held as one tile and read once."""
        pid = tl.program_id(0)
        col = pid % gk
        rest = pid // gk
        rt = rest % row_tiles
        b = (rest // row_tiles).to(tl.int64)
        row0 = rt * ROWS
        col0 = col * BK
        c_in = tl.arange(0, BK_P2)
        # 64-bit tile origins, 32-bit offsets inside the tile (the wrapper checks that they fit)
        x_tile = x_ptr + (b * sxb + row0.to(tl.int64) * sxn + col0.to(tl.int64) * sxk)
        q_tile = q_ptr + ((b * N + row0) * K + col0)
        if BN == 1:
            r = tl.arange(0, SUB)
            row_ok = r < ROWS
            bits, mask = _load_bits(x_tile, r, c_in, row0, N, K, col0, sxn, sxk, row_ok, IN_KIND, BK)
            scale, scale_inv = _scale(tl.max(_abs_bits(bits), axis=1), eps, USE_EPS, POW2, FP8_MAX, INPUT_MAX)
            y = bits.to(tl.float32, bitcast=True) * scale[:, None]
            codes = _fp8_codes(y, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
            tl.store(q_tile + (r[:, None] * K + c_in[None, :]), codes, mask=mask)
            tl.store(s_ptr + (b * gn + row0 + r) * gk + col, scale_inv, mask=row_ok & (row0 + r < N))
        elif SUB == ROWS:     # the whole block in one tile: read once (the bench tries it against the slices)
            r = tl.arange(0, SUB)
            bits, mask = _load_bits(x_tile, r, c_in, row0, N, K, col0, sxn, sxk, r < ROWS, IN_KIND, BK)
            amax_bits = tl.max(tl.max(_abs_bits(bits), axis=1), axis=0)
            scale, scale_inv = _scale(amax_bits, eps, USE_EPS, POW2, FP8_MAX, INPUT_MAX)
            y = bits.to(tl.float32, bitcast=True) * scale
            codes = _fp8_codes(y, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
            tl.store(q_tile + (r[:, None] * K + c_in[None, :]), codes, mask=mask)
            tl.store(s_ptr + (b * gn + rt) * gk + col, scale_inv)
        else:
            amax_bits = tl.zeros((SUB,), tl.int32)
            for r0 in tl.range(0, ROWS, SUB):
                r = r0 + tl.arange(0, SUB)
                bits, mask = _load_bits(x_tile, r, c_in, row0, N, K, col0, sxn, sxk, r < ROWS, IN_KIND, BK)
                amax_bits = tl.maximum(amax_bits, tl.max(_abs_bits(bits), axis=1))
            scale, scale_inv = _scale(tl.max(amax_bits, axis=0), eps, USE_EPS, POW2, FP8_MAX, INPUT_MAX)
            for r0 in tl.range(0, ROWS, SUB):
                r = r0 + tl.arange(0, SUB)
                bits, mask = _load_bits(x_tile, r, c_in, row0, N, K, col0, sxn, sxk, r < ROWS, IN_KIND, BK)
                y = bits.to(tl.float32, bitcast=True) * scale
                codes = _fp8_codes(y, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
                tl.store(q_tile + (r[:, None] * K + c_in[None, :]), codes, mask=mask)
            tl.store(s_ptr + (b * gn + rt) * gk + col, scale_inv)


_IN_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def quantize_blockwise_triton(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False,
                              amax_epsilon: float = 0.0, fp8_dtype: torch.dtype = E4M3):
    """Triton twin of `quantize_blockwise` (same signature): (codes [.., N, K] fp8, scale_inv [.., gn, gk] fp32),
    the same bytes.  Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1."""
    return launch(x, block_shape, pow2=pow2, amax_epsilon=amax_epsilon, fp8_dtype=fp8_dtype)


def launch(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False, amax_epsilon: float = 0.0,
           fp8_dtype: torch.dtype = E4M3, rows_per_program: int | None = None, slice_rows: int | None = None,
           num_warps: int | None = None, hw_cast: bool | None = None):
    """`quantize_blockwise_triton` with the launch knobs exposed (tuning, fast interpreter tests); they never
    change the result: `rows_per_program` (1xBK blocks: rows per program), `slice_rows` (BN > 1: rows read per
    step of the block's two passes), `num_warps`, `hw_cast` (the hardware fp8 conversion; default: on a CUDA
    tensor, where it is exact, and never under the interpreter, where it is not)."""
    if triton is None:
        raise ImportError(f"quantize_blockwise_triton needs Triton ({_IMPORT_ERROR}); "
                          f"use harness.formats.quantize_blockwise on machines without it")
    if x.dim() < 2:
        raise ValueError(f"quantize_blockwise expects a 2D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in _IN_KIND:
        raise ValueError(f"input dtype {x.dtype} is not one of {list(_IN_KIND)}")
    if fp8_dtype not in _FORMATS:
        raise ValueError(f"fp8_dtype {fp8_dtype} is not one of {list(_FORMATS)}")
    bn, bk = block_shape
    n, k = x.shape[-2:]
    gn, gk = grid_shape(x.shape, block_shape)
    q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    s = torch.empty((*x.shape[:-2], gn, gk), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, s
    x3 = x.reshape(-1, n, k)                                    # a view unless the leading dims are scrambled
    raw = x3.view(torch.int32 if x.dtype == torch.float32 else torch.int16)
    rows = bn if bn > 1 else (rows_per_program or max(1, min(32, 4096 // _p2(bk))))
    sub = _p2(rows) if bn == 1 else min(_p2(rows), _p2(slice_rows or max(1, 4096 // _p2(bk))))
    row_tiles = -(-n // rows)
    span = max(rows * abs(raw.stride(1)) + _p2(bk) * abs(raw.stride(2)), rows * k + _p2(bk))
    if span >= 2 ** 31:
        raise ValueError(f"a {rows}x{bk} tile spans {span} elements: 32-bit in-tile offsets overflow")
    mant, bias, fmax, max_code = _FORMATS[fp8_dtype]
    eps32 = float(torch.tensor(amax_epsilon, dtype=torch.float32))   # the reference's fp32 rounding of eps
    grid = (x3.shape[0] * row_tiles * gk,)
    _blockwise_kernel[grid](
        raw, q.view(torch.uint8), s, n, k, raw.stride(0), raw.stride(1), raw.stride(2), gn, gk, row_tiles, eps32,
        IN_KIND=_IN_KIND[x.dtype], BN=bn, BK=bk, ROWS=rows, SUB=sub, BK_P2=_p2(bk),
        POW2=bool(pow2), USE_EPS=amax_epsilon > 0.0, FP8_MAX=fmax, INPUT_MAX=INPUT_DTYPE_MAX[x.dtype],
        MANT=mant, BIAS=bias, MAX_BITS=int(torch.tensor(fmax, dtype=torch.float32).view(torch.int32)),
        MAX_CODE=max_code, NAN_CODE=E4M3_NAN_BYTE, HW_CAST=x.is_cuda if hw_cast is None else bool(hw_cast),
        num_warps=num_warps or 8)
    return q, s
