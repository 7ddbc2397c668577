"""Blockwise FP8 quantizer as one Triton kernel, byte-identical to `harness.formats.quantize_blockwise`.

Same signature, semantics and wire layout as the CPU reference (codes [.., N, K], scale_inv [.., gn, gk], leading
expert dims per 2D slice); tests/test_triton_quantizer.py (interpreter) and tests/gpu/test_triton_conformance.py
(H200, against TE too) prove the bytes.  The jit helpers below are the one source of the rounding rule: the
quantizer and C1's fused re-quantize-and-compare (`triton_requantize`) both call `_tile_amax`, `_scale` and
`_tile_codes`.

Why each step is exact on sm90 as well as under TRITON_INTERPRET=1:
* Inputs are loaded as raw integers.  bf16 -> fp32 is `bits << 16`; fp16 -> fp32 is the hardware `cvt.f32.f16`
  (exact, subnormals kept); amax is an integer max of |bits| (for non-negative floats integer order is float
  order), so no float max/NaN semantics are involved.  NaN bit patterns sort above inf: a block whose max is
  above 0x7F800000 holds a NaN, and only then is the max taken again with NaN patterns as 0 (TE skips NaN); the
  common block pays two integer operations per element for its amax, not four.
* Both divisions are `tl.math.div_rn` (PTX `div.rn.f32`, IEEE round-to-nearest, no ftz).  A plain `/` is
  `div.full.f32` on the GPU (about 2 ulp) but exact in the interpreter, so tests check the source for it.
* y = x * scale is one fp32 `mul` with nothing to contract it into an FMA (its only consumer is a conversion);
  Triton sets no flush-to-zero for it (libdevice ftz does not apply: no libdevice call is made).
* The fp8 cast, on the GPU, is the hardware's `cvt.rn.satfinite.e4m3x2.f32` (`.to(tl.float8e4nv)`, round to
  nearest even, saturating to +-448: the conversion TE's own kernels run, `__nv_cvt_float_to_fp8(.., SATFINITE)`),
  with NaN written as 0x7F whatever its sign (selected only in a block that holds a NaN).  Under the interpreter it
  is an integer round-to-nearest-even encoder with the same results (`_fp8_encode`), because the interpreter's
  float8 conversion (triton 3.6 `interpreter._convert_float`) rounds ties away from zero, does not saturate and
  mis-encodes NaN and fp8 subnormals (1.0625 -> 0x39, 500 -> 0x78, NaN -> 0x7C, 1.5 * 2^-9 -> 0x01).  The integer
  encoder costs about 20 integer operations per element (the interpreter's path only).  The sm90 PTX of
  both builds is checked in tests/test_triton_quantizer.py; the GPU build's bytes against TE's on the H200
  (tests/gpu/test_triton_conformance.py, bench/gpu_quantize.py).

Speed (issue 23): the kernel moves 1.5 bytes per bf16 input byte (read 2, write 1 code + 4/16384 of a scale) and
is meant to be bound by that.  A work item is a whole 128x128 block (or ROWS rows of 1xBK blocks) held as one tile:
every input byte is read once, with 16-byte loads, every code written once with 16-byte stores.  What bounded the
earlier kernel was its instruction count, about 17 SASS instructions per element (a per-element NaN test and select
in the amax and again after the cast); the common tile now takes about 9.5 per element, index math and reductions
included (sm90 SASS of the 8-warp tile from Triton 3.6: 461 to load, unpack and reduce 64 elements a thread --
the bf16 unpack still costs an extract and a shift, and the amax a shift and a max -- and 145 to scale, convert
in pairs and store them).  By default a persistent grid walks the work
items and the compiler's software pipeline copies the next tiles into shared memory (cp.async) while one is
quantized, so reads stay in flight without holding registers.  The host side counts too: a call cost ~50 us of
Python before the launch (constants made as tensors, ~25 kwargs), as much as the kernel of a 4096x4096 weight;
the constants are now cached per (dtype, recipe).  Launch variants (`VARIANTS`) never change the bytes;
`DEFAULT_VARIANT` is the one constant to switch after a measurement (bench/gpu_quantize.py).
"""
from __future__ import annotations

import functools

import torch

from .constants import E4M3, E4M3_NAN_BYTE, E5M2, INPUT_DTYPE_MAX, WEIGHT_BLOCK

try:
    import triton
    import triton.language as tl
except ImportError as _e:          # CPU machines without Triton still import harness.formats
    triton = tl = None
    _IMPORT_ERROR = _e

# fp8 format: (mantissa bits, exponent bias, largest finite value, its code)
_FORMATS = {E4M3: (3, 7, 448.0, 0x7E), E5M2: (2, 15, 57344.0, 0x7B)}

# Launch variants (bench/gpu_quantize.py times each on the H200 beside TE; they never change the bytes).  Each
# has a plan for BNxBK blocks with BN > 1 ("block": one 128x128 block per work item) and one for 1xBK blocks
# ("row": `rows` rows, one block each, per work item):
#   warps:  warps per program
#   slice:  (block plan) None: the whole block as one tile, read once; an int: rows per step of a two-pass walk
#           (amax, then quantize: the second pass re-reads the rows from L1/L2; the earlier kernel's way)
#   stages: 0: one program per work item; >= 1: a persistent grid of `per_sm` programs per multiprocessor, each
#           walking work items, with the next stages - 1 tiles copied to shared memory while one is quantized
VARIANTS = {
    # registers and shared memory per program as Triton 3.6 builds them for sm90 (bf16): 128 regs x 256 threads and
    # 64 KiB -> 2 programs per SM, 4 tiles in flight
    "persist-w8-s3": {"block": dict(warps=8, slice=None, stages=3, per_sm=2),
                      "row": dict(rows=32, warps=4, stages=3, per_sm=4)},
    # 104 regs x 512 threads, 96 KiB -> 1 per SM, 3 tiles in flight, 16 warps to quantize one
    "persist-w16-s4": {"block": dict(warps=16, slice=None, stages=4, per_sm=1),
                       "row": dict(rows=64, warps=8, stages=4, per_sm=2)},
    # 128 regs, 32 KiB -> 2 per SM, one tile ahead each
    "persist-w8-s2": {"block": dict(warps=8, slice=None, stages=2, per_sm=2),
                      "row": dict(rows=32, warps=4, stages=2, per_sm=4)},
    # one program per block, the tile in registers: 55 regs x 512 threads -> 2 per SM
    "tile-w16": {"block": dict(warps=16, slice=None, stages=0, per_sm=0),
                 "row": dict(rows=64, warps=8, stages=0, per_sm=0)},
    # 127 regs x 256 threads -> 2 per SM
    "tile-w8": {"block": dict(warps=8, slice=None, stages=0, per_sm=0),
                "row": dict(rows=32, warps=4, stages=0, per_sm=0)},
    # the earlier kernel's best knobs (two 64-row passes over each block) on the new arithmetic: 31 regs -> 4 per SM
    "slices-w16-64": {"block": dict(warps=16, slice=64, stages=0, per_sm=0),
                      "row": dict(rows=32, warps=8, stages=0, per_sm=0)},
}
# the fastest 128x128 variant where it was measured (results/h200-quantizer.json, `fp8check bench --gpu`)
DEFAULT_VARIANT = "tile-w8"
_MAX_TILE = 1 << 14                 # elements of a one-tile block (128x128); larger blocks are walked in slices
_INTERPRETED_PROGRAMS = 3           # a persistent grid under the interpreter: few programs, so each walks items

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
        """fp32 values -> fp8 codes (uint8): RNE, saturating.  NaN: NAN_CODE from the integer encoder, the
        hardware's own NaN code from HW_CAST (`_tile_codes` writes NAN_CODE over it)."""
        if HW_CAST:
            if MANT == 3:
                h = y.to(tl.float8e4nv, fp_downcast_rounding="rtne")
            else:
                h = y.to(tl.float8e5, fp_downcast_rounding="rtne")
            return h.to(tl.uint8, bitcast=True)
        return _fp8_encode(y.to(tl.int32, bitcast=True), MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE).to(tl.uint8)

    @triton.jit
    def _f32_bits(raw, IN_KIND: tl.constexpr):
        """Raw input integers -> fp32 bit patterns (int32), exactly."""
        if IN_KIND == 0:      # bf16 bits -> fp32 bits
            return raw.to(tl.uint16, bitcast=True).to(tl.int32) << 16
        elif IN_KIND == 1:    # fp16 -> fp32, exact hardware conversion
            return raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        else:                 # fp32
            return raw

    @triton.jit
    def _tile_bits(x_tile, r, row_ok, col0, K, sxn, sxk, IN_KIND: tl.constexpr, BK: tl.constexpr,
                   BK_P2: tl.constexpr, EVEN: tl.constexpr):
        """fp32 bit patterns (int32) of tile rows r x BK_P2 columns; outside the tensor: 0."""
        c = tl.arange(0, BK_P2)
        ptrs = x_tile + (r[:, None] * sxn + c[None, :] * sxk)
        if EVEN:
            raw = tl.load(ptrs)
        else:
            raw = tl.load(ptrs, mask=row_ok[:, None] & ((c < BK) & (col0 + c < K))[None, :], other=0)
        return _f32_bits(raw, IN_KIND)

    @triton.jit
    def _scale(amax_bits, eps, pow2, FP8_MAX: tl.constexpr, INPUT_MAX: tl.constexpr):
        """TE's compute_scale_from_amax on |x| bit patterns (NaN already skipped) -> (scale, scale_inv).  eps and
        pow2 are run-time scalars (one build serves every recipe): an epsilon of 0 changes no amax (amax >= +0),
        as the reference's `if amax_epsilon > 0` skips it; pow2 != 0 keeps the sign and exponent bits."""
        amax = amax_bits.to(tl.float32, bitcast=True)
        amax = tl.where(amax < eps, eps, amax)
        scale = tl.math.div_rn(tl.full(amax.shape, FP8_MAX, tl.float32), amax)
        scale = tl.where(scale.to(tl.int32, bitcast=True) == 0x7F800000, INPUT_MAX, scale)   # overflow
        abits = amax.to(tl.int32, bitcast=True)
        scale = tl.where((abits == 0) | (abits >= 0x7F800000), 1.0, scale)                    # amax 0 / inf
        scale = tl.where(pow2 != 0, (scale.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True), scale)
        return scale, tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)

    @triton.jit
    def _tile_amax(bits, NAN_FREE: tl.constexpr, ROWWISE: tl.constexpr):
        """Largest |x| bit pattern (int32) of the tile, or of each row with ROWWISE.  NAN_FREE: NaN patterns as 0
        (TE skips NaN).  Without it NaN patterns sort above inf (see `_has_nan`), and |x| is taken as `bits << 1`
        compared unsigned, not `bits & 0x7FFFFFFF`: the NaN-free max of a tile with NaN repeats the `and`, and a
        compiler that sees the same expression twice keeps its 64 registers a thread alive across the branch."""
        if NAN_FREE:
            ab = bits & 0x7FFFFFFF
            ab = tl.where(ab > 0x7F800000, 0, ab)
        else:
            ab = (bits << 1).to(tl.uint32, bitcast=True)
        if ROWWISE:
            amax = tl.max(ab, axis=1)
        else:
            amax = tl.max(tl.max(ab, axis=1), axis=0)
        if not NAN_FREE:
            amax = (amax >> 1).to(tl.int32, bitcast=True)
        return amax

    @triton.jit
    def _has_nan(amax, ROWWISE: tl.constexpr):
        """Some |x| pattern above inf's: the tile holds a NaN (a scalar, the same for every thread)."""
        if ROWWISE:
            top = tl.max(amax, axis=0)
        else:
            top = amax
        return top > 0x7F800000

    @triton.jit
    def _tile_codes(bits, scale, ROWWISE: tl.constexpr, NAN_SEEN: tl.constexpr, HW_CAST: tl.constexpr,
                    MANT: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr,
                    NAN_CODE: tl.constexpr):
        """fp8 codes (uint8) of fp32 bit patterns times the block's scale (one, or one per row with BN == 1):
        y = x * scale, one fp32 multiply, then the RNE saturating cast.  NAN_SEEN: the tile may hold NaN, which
        TE writes as NAN_CODE whatever its sign (the hardware conversion's NaN code is replaced; the integer
        encoder writes NAN_CODE itself)."""
        if ROWWISE:
            y = bits.to(tl.float32, bitcast=True) * scale[:, None]
        else:
            y = bits.to(tl.float32, bitcast=True) * scale
        codes = _fp8_codes(y, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
        if HW_CAST and NAN_SEEN:
            codes = tl.where(y != y, NAN_CODE, codes.to(tl.int32)).to(tl.uint8)
        return codes

    @triton.jit
    def _sliced_amax(x_tile, row0, N, K, col0, sxn, sxk, IN_KIND: tl.constexpr, ROWS: tl.constexpr,
                     SUB: tl.constexpr, BK: tl.constexpr, BK_P2: tl.constexpr):
        """A block too large for one tile (first of two passes): its rows read in SUB-row slices -> (NaN-free amax
        bit pattern, whether it holds NaN)."""
        c_in = tl.arange(0, BK_P2)
        amax = tl.zeros((SUB,), tl.int32)
        top = tl.zeros((SUB,), tl.int32)
        for r0 in tl.range(0, ROWS, SUB):
            r = r0 + tl.arange(0, SUB)
            mask = ((r < ROWS) & (row0 + r < N))[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :]
            raw = tl.load(x_tile + (r[:, None] * sxn + c_in[None, :] * sxk), mask=mask, other=0)
            ab = _f32_bits(raw, IN_KIND) & 0x7FFFFFFF
            top = tl.maximum(top, tl.max(ab, axis=1))
            amax = tl.maximum(amax, tl.max(tl.where(ab > 0x7F800000, 0, ab), axis=1))
        return tl.max(amax, axis=0), tl.max(top, axis=0) > 0x7F800000

    @triton.jit
    def _quantize_block(pid, x_ptr, q_ptr, s_ptr, N, K, sxb, sxn, sxk, gn, gk, row_tiles, eps, pow2,
                        IN_KIND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr,
                        SUB: tl.constexpr, BK_P2: tl.constexpr, EVEN: tl.constexpr,
                        FP8_MAX: tl.constexpr, INPUT_MAX: tl.constexpr, MANT: tl.constexpr,
                        BIAS: tl.constexpr, MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                        HW_CAST: tl.constexpr):
        """Work item `pid`: ROWS rows x BK columns.  BN == 1: ROWS blocks of one row.  BN > 1 (ROWS == BN): one
        block, as one SUB-row tile (SUB >= ROWS: read once) or walked in SUB-row slices twice (amax, then
        quantize).  EVEN: the tile lies inside the tensor (no masks)."""
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
        if SUB >= ROWS:
            r = tl.arange(0, SUB)
            row_ok = (r < ROWS) & (row0 + r < N)
            mask = None if EVEN else row_ok[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :]
            q_ptrs = q_tile + (r[:, None] * K + c_in[None, :])
            if BN == 1:
                s_ptrs = s_ptr + ((b * gn + row0 + r) * gk + col)
                s_mask = row_ok
            else:
                s_ptrs = s_ptr + ((b * gn + rt) * gk + col)
                s_mask = None
            bits = _tile_bits(x_tile, r, row_ok, col0, K, sxn, sxk, IN_KIND, BK, BK_P2, EVEN)
            amax = _tile_amax(bits, False, BN == 1)
            # two copies of the tail, so that nothing tile-sized crosses the branch but the loaded tile (an `if`
            # yielding a tile costs its registers twice): the common one, and one for a tile holding NaN
            if _has_nan(amax, BN == 1):
                amax = _tile_amax(bits, True, BN == 1)
                scale, scale_inv = _scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
                codes = _tile_codes(bits, scale, BN == 1, True, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
                tl.store(q_ptrs, codes, mask=mask)
                tl.store(s_ptrs, scale_inv, mask=s_mask)
            else:
                scale, scale_inv = _scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
                codes = _tile_codes(bits, scale, BN == 1, False, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
                tl.store(q_ptrs, codes, mask=mask)
                tl.store(s_ptrs, scale_inv, mask=s_mask)
        else:
            amax, has_nan = _sliced_amax(x_tile, row0, N, K, col0, sxn, sxk, IN_KIND, ROWS, SUB, BK, BK_P2)
            scale, scale_inv = _scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
            for r0 in tl.range(0, ROWS, SUB):
                r = r0 + tl.arange(0, SUB)
                mask = ((r < ROWS) & (row0 + r < N))[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :]
                raw = tl.load(x_tile + (r[:, None] * sxn + c_in[None, :] * sxk), mask=mask, other=0)
                codes = _tile_codes(_f32_bits(raw, IN_KIND), scale, False, True, HW_CAST, MANT, BIAS, MAX_BITS,
                                    MAX_CODE, NAN_CODE)
                tl.store(q_tile + (r[:, None] * K + c_in[None, :]), codes, mask=mask)
            tl.store(s_ptr + (b * gn + rt) * gk + col, scale_inv)

    @triton.jit(do_not_specialize=["pow2"])
    def _blockwise_kernel(x_ptr, q_ptr, s_ptr, N, K, sxb, sxn, sxk, gn, gk, row_tiles, items, eps, pow2,
                          IN_KIND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          ROWS: tl.constexpr, SUB: tl.constexpr, BK_P2: tl.constexpr, EVEN: tl.constexpr,
                          STAGES: tl.constexpr, FP8_MAX: tl.constexpr,
                          INPUT_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                          MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                          HW_CAST: tl.constexpr):
        """`items` work items (`_quantize_block`).  STAGES == 0: one program each.  STAGES > 0: a persistent grid,
        each program walking items pid, pid + programs, ...; with STAGES > 1 the compiler's software pipeline
        copies the next STAGES - 1 tiles into shared memory (cp.async) while this one is quantized, so a program
        keeps reads in flight without holding them in registers."""
        if STAGES == 0:
            _quantize_block(tl.program_id(0), x_ptr, q_ptr, s_ptr, N, K, sxb, sxn, sxk, gn, gk, row_tiles, eps,
                            pow2, IN_KIND, BN, BK, ROWS, SUB, BK_P2, EVEN, FP8_MAX, INPUT_MAX, MANT, BIAS, MAX_BITS,
                            MAX_CODE, NAN_CODE, HW_CAST)
        else:
            for pid in tl.range(tl.program_id(0), items, tl.num_programs(0), num_stages=STAGES):
                _quantize_block(pid, x_ptr, q_ptr, s_ptr, N, K, sxb, sxn, sxk, gn, gk, row_tiles, eps, pow2,
                                IN_KIND, BN, BK, ROWS, SUB, BK_P2, EVEN, FP8_MAX, INPUT_MAX, MANT, BIAS, MAX_BITS,
                                MAX_CODE, NAN_CODE, HW_CAST)


_IN_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_RAW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=None)
def format_constants(dtype: torch.dtype, fp8_dtype: torch.dtype, amax_epsilon: float) -> tuple:
    """(eps as the reference rounds it to fp32, the kernels' format constexprs): made once per recipe and input
    dtype (a torch.tensor per call cost more host time than a small kernel runs)."""
    mant, bias, fmax, max_code = _FORMATS[fp8_dtype]
    eps32 = float(torch.tensor(max(amax_epsilon, 0.0), dtype=torch.float32))
    return eps32, dict(FP8_MAX=fmax, INPUT_MAX=INPUT_DTYPE_MAX[dtype], MANT=mant, BIAS=bias,
                       MAX_BITS=int(torch.tensor(fmax, dtype=torch.float32).view(torch.int32)),
                       MAX_CODE=max_code, NAN_CODE=E4M3_NAN_BYTE)


def check_inputs(x: torch.Tensor, fp8_dtype: torch.dtype) -> None:
    if triton is None:
        raise ImportError(f"quantize_blockwise_triton needs Triton ({_IMPORT_ERROR}); "
                          f"use harness.formats.quantize_blockwise on machines without it")
    if x.dim() < 2:
        raise ValueError(f"quantize_blockwise expects a 2D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in _IN_KIND:
        raise ValueError(f"input dtype {x.dtype} is not one of {list(_IN_KIND)}")
    if fp8_dtype not in _FORMATS:
        raise ValueError(f"fp8_dtype {fp8_dtype} is not one of {list(_FORMATS)}")


def plan(block_shape, variant: str | None = None, rows_per_program=None, slice_rows=None) -> tuple:
    """(rows per work item, rows per tile, warps, stages, programs per SM) for a block shape under a launch
    variant; rows per tile >= rows per work item means one tile (read once).  A block too large for one tile is
    walked in slices by one program per block (stages 0)."""
    bn, bk = block_shape
    if bn == 1:
        p = VARIANTS[variant or DEFAULT_VARIANT]["row"]
        rows = _p2(rows_per_program or max(1, min(p["rows"], _MAX_TILE // _p2(bk))))
        return rows, rows, p["warps"], p["stages"], p["per_sm"]
    p = VARIANTS[variant or DEFAULT_VARIANT]["block"]
    if slice_rows is None:
        slice_rows = p["slice"]
    if slice_rows is None and _p2(bn) * _p2(bk) <= _MAX_TILE:
        return bn, _p2(bn), p["warps"], p["stages"], p["per_sm"]
    sub = min(_p2(bn), _p2(slice_rows or max(1, _MAX_TILE // (4 * _p2(bk)))))
    return bn, sub, p["warps"], (p["stages"] if sub >= bn else 0), p["per_sm"]


_SMS: dict = {}


def programs(items: int, stages: int, per_sm: int, device: torch.device) -> int:
    """Grid size: one program per work item, or a persistent grid of per_sm programs per multiprocessor."""
    if not stages:
        return items
    if device.type != "cuda":
        return min(items, _INTERPRETED_PROGRAMS)
    sms = _SMS.get(device.index)
    if sms is None:
        sms = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return min(items, per_sm * sms)


def quantize_blockwise_triton(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False,
                              amax_epsilon: float = 0.0, fp8_dtype: torch.dtype = E4M3):
    """Triton twin of `quantize_blockwise` (same signature): (codes [.., N, K] fp8, scale_inv [.., gn, gk] fp32),
    the same bytes.  Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1."""
    return launch(x, block_shape, pow2=pow2, amax_epsilon=amax_epsilon, fp8_dtype=fp8_dtype)


def launch(x: torch.Tensor, block_shape=WEIGHT_BLOCK, *, pow2: bool = False, amax_epsilon: float = 0.0,
           fp8_dtype: torch.dtype = E4M3, variant: str | None = None, rows_per_program: int | None = None,
           slice_rows: int | None = None, num_warps: int | None = None, hw_cast: bool | None = None):
    """`quantize_blockwise_triton` with the launch knobs exposed (tuning, fast interpreter tests); they never
    change the result: `variant` (a key of VARIANTS; default DEFAULT_VARIANT), and over it `rows_per_program`
    (1xBK blocks: rows per work item), `slice_rows` (BN > 1: rows per step of a two-pass walk over the block; at
    least BN: the whole block as one tile), `num_warps`, `hw_cast` (the hardware fp8 conversion; default: on a
    CUDA tensor, where it is exact, and never under the interpreter, where it is not)."""
    check_inputs(x, fp8_dtype)
    bn, bk = block_shape
    n, k = x.shape[-2:]
    gn, gk = -(-n // bn), -(-k // bk)
    q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    s = torch.empty((*x.shape[:-2], gn, gk), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, s
    if x.dim() == 2:                                            # the common case: no reshape
        raw, batches, sxb = x.view(_RAW[x.dtype]), 1, 0
    else:                                                       # a view unless the leading dims are scrambled
        raw = x.reshape(-1, n, k).view(_RAW[x.dtype])
        batches, sxb = raw.shape[0], raw.stride(0)
    sxn, sxk = raw.stride(-2), raw.stride(-1)
    hw = x.is_cuda if hw_cast is None else bool(hw_cast)
    rows, sub, stages, per_sm, eps32, kw = _launch_config(
        x.dtype, fp8_dtype, float(amax_epsilon), bn, bk, variant, rows_per_program, slice_rows, num_warps, hw)
    row_tiles, bk2 = -(-n // rows), kw["BK_P2"]
    if max(rows * abs(sxn) + bk2 * abs(sxk), rows * k + bk2) >= 2 ** 31:
        raise ValueError(f"a {rows}x{bk} tile spans more than 2^31 elements: 32-bit in-tile offsets overflow")
    items = batches * row_tiles * gk
    _blockwise_kernel[(programs(items, stages, per_sm, x.device),)](
        raw, q.view(torch.uint8), s, n, k, sxb, sxn, sxk, gn, gk, row_tiles, items, eps32, int(bool(pow2)),
        EVEN=sub == rows and n % rows == 0 and k % bk == 0 and bk2 == bk, **kw)
    return q, s


@functools.lru_cache(maxsize=1024)
def _launch_config(dtype, fp8_dtype, amax_epsilon, bn, bk, variant, rows_per_program, slice_rows, num_warps,
                   hw_cast) -> tuple:
    """(rows per work item, rows per tile, stages, programs per SM, eps, the launch's constexpr kwargs) of one
    launch configuration, made once (host time per call is part of a small weight's quantize time)."""
    rows, sub, warps, stages, per_sm = plan((bn, bk), variant, rows_per_program, slice_rows)
    eps32, consts = format_constants(dtype, fp8_dtype, amax_epsilon)
    kw = dict(IN_KIND=_IN_KIND[dtype], BN=bn, BK=bk, ROWS=rows, SUB=sub, BK_P2=_p2(bk), STAGES=stages,
              HW_CAST=hw_cast, num_warps=num_warps or warps, **consts)
    return rows, sub, stages, per_sm, eps32, kw
