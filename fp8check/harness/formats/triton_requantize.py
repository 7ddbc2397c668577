"""C1's question on the device, fused: does re-quantizing each master with the recipe give the trainer's bytes?

`requantize_mismatch(masters, codes, scales, ...)[i]` is `not (bits_equal(q, codes[i]) and bits_equal(s,
scales[i]))` with `(q, s) = quantize_blockwise(masters[i], ...)`, computed without writing q or s: each program
reads one block of a master (128x128, or ROWS rows of 1xBK blocks), quantizes it in registers through the
quantizer's own jit helpers (`triton_blockwise`: the one source of the rounding rule), reads the given codes and
scale_inv of that block and sets the tensor's flag when a byte differs.  Every input byte is read once; nothing but
the flags is written; the flags stay on the device (no host sync).

A pointer table (one int64 row per 2D slice, `ROW` fields) so that a model's weights cost a few launches: one per
(master dtype, layout class, whole tiles or not), at most 18.  Addresses are offsets from one tensor of the
launch's group, so that where every tensor of a group is 16-byte aligned with 16-byte row pitches and K a multiple
of 16 (`LAYOUT` 2), the compiler can prove it and load 16-byte vectors (an address loaded from memory is only
known to be 4-byte aligned: harness/digest_triton.py); `EVEN` groups (whole tiles) carry no masks.
"""
from __future__ import annotations

import contextlib
import itertools

import torch

from .constants import E4M3, WEIGHT_BLOCK
from . import triton_blockwise as tb

triton, tl = tb.triton, tb.tl

# table row: master offset (elements), codes offset (bytes), scale offset (fp32 elements), N, K, master strides
# (row, col), codes strides (row, col), scale strides (row, col), gk, row tiles, first program, flag, has a scale
ROW = 16

if triton is not None:
    @triton.jit(do_not_specialize=["pid0", "pow2"])
    def _requantize_kernel(table_ptr, piece_ptr, flag_ptr, x_base, q_base, s_base, eps, pow2, pid0,
                           ROW: tl.constexpr, IN_KIND: tl.constexpr, VEC: tl.constexpr, LAYOUT: tl.constexpr,
                           EVEN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr,
                           SUB: tl.constexpr, BK_P2: tl.constexpr, FP8_MAX: tl.constexpr,
                           INPUT_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                           MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                           HW_CAST: tl.constexpr):
        """Program pid0 + program_id: one block (BN > 1) or ROWS rows of 1xBK blocks of one table row's slice;
        sets the row's flag where a recomputed code or scale_inv differs from the given one.  One program per work
        item: a persistent, pipelined grid (the quantizer's default) needed 184 registers here, the table's loads
        pipelined with the tiles."""
        pid = pid0 + tl.program_id(0)
        row = table_ptr + tl.load(piece_ptr + pid).to(tl.int64) * ROW
        x_off = tl.load(row)
        q_off = tl.load(row + 1)
        s_off = tl.load(row + 2)
        N = tl.load(row + 3).to(tl.int32)
        K = tl.load(row + 4).to(tl.int32)
        sxn = tl.load(row + 5)
        sqn = tl.load(row + 7)
        ssn = tl.load(row + 9)
        ssk = tl.load(row + 10)
        gk = tl.load(row + 11).to(tl.int32)
        block = (pid - tl.load(row + 13)).to(tl.int32)
        has_s = tl.load(row + 15) != 0          # no scale: its pointer is any valid one, its comparison off
        if LAYOUT == 2:   # unit column strides, 16-byte aligned origins and pitches, K a multiple of 16 (the plan's word)
            x_off = tl.multiple_of(x_off, VEC)
            sxn = tl.multiple_of(sxn, VEC)
            q_off = tl.multiple_of(q_off, 16)
            sqn = tl.multiple_of(sqn, 16)
            K = tl.multiple_of(K, 16)
        if LAYOUT >= 1:   # unit column strides
            sxk = 1
            sqk = 1
        else:
            sxk = tl.load(row + 6)
            sqk = tl.load(row + 8)
        rt = block // gk
        col = block % gk
        row0 = rt * ROWS
        col0 = col * BK
        c_in = tl.arange(0, BK_P2)
        x_tile = x_base + (x_off + row0.to(tl.int64) * sxn + col0.to(tl.int64) * sxk)
        q_tile = q_base + (q_off + row0.to(tl.int64) * sqn + col0.to(tl.int64) * sqk)
        if BN == 1:
            r = tl.arange(0, SUB)
            s_ptrs = s_base + (s_off + (row0 + r).to(tl.int64) * ssn + col * ssk)
        else:
            s_ptrs = s_base + (s_off + rt.to(tl.int64) * ssn + col * ssk)
        if SUB >= ROWS:
            r = tl.arange(0, SUB)
            row_ok = (r < ROWS) & (row0 + r < N)
            q_ptrs = q_tile + (r[:, None] * sqn + c_in[None, :] * sqk)
            s_mask = has_s & row_ok if BN == 1 else has_s
            bits = tb._tile_bits(x_tile, r, row_ok, col0, K, sxn, sxk, IN_KIND, BK, BK_P2, EVEN)
            if EVEN:
                given = tl.load(q_ptrs)
            else:
                given = tl.load(q_ptrs, mask=row_ok[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :], other=0)
            if BN == 1:
                given_s = tl.load(s_ptrs, mask=row_ok, other=0)
            else:
                given_s = tl.load(s_ptrs)
            amax = tb._tile_amax(bits, False, BN == 1)
            # as in the quantizer: a common tail and one for a tile holding NaN, nothing tile-sized across the `if`
            if tb._has_nan(amax, BN == 1):
                amax = tb._tile_amax(bits, True, BN == 1)
                scale, scale_inv = tb._scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
                codes = tb._tile_codes(bits, scale, BN == 1, True, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
                bad = _differs(codes, given, scale_inv, given_s, s_mask, BN == 1)
            else:
                scale, scale_inv = tb._scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
                codes = tb._tile_codes(bits, scale, BN == 1, False, HW_CAST, MANT, BIAS, MAX_BITS, MAX_CODE, NAN_CODE)
                bad = _differs(codes, given, scale_inv, given_s, s_mask, BN == 1)
        else:
            amax, has_nan = tb._sliced_amax(x_tile, row0, N, K, col0, sxn, sxk, IN_KIND, ROWS, SUB, BK, BK_P2)
            scale, scale_inv = tb._scale(amax, eps, pow2, FP8_MAX, INPUT_MAX)
            bad = (has_s & (scale_inv.to(tl.int32, bitcast=True) != tl.load(s_ptrs))).to(tl.int32)
            for r0 in tl.range(0, ROWS, SUB):
                r = r0 + tl.arange(0, SUB)
                mask = ((r < ROWS) & (row0 + r < N))[:, None] & ((c_in < BK) & (col0 + c_in < K))[None, :]
                raw = tl.load(x_tile + (r[:, None] * sxn + c_in[None, :] * sxk), mask=mask, other=0)
                given = tl.load(q_tile + (r[:, None] * sqn + c_in[None, :] * sqk), mask=mask, other=0)
                codes = tb._tile_codes(tb._f32_bits(raw, IN_KIND), scale, False, True, HW_CAST, MANT, BIAS,
                                       MAX_BITS, MAX_CODE, NAN_CODE)
                bad = bad | tl.max(tl.max((codes != given).to(tl.int32), axis=1), axis=0)
        tl.store(flag_ptr + tl.load(row + 14), 1, mask=bad != 0)

    @triton.jit
    def _differs(codes, given, scale_inv, given_s, s_mask, ROWWISE: tl.constexpr):
        """1 where a code byte inside the tensor, or a present scale_inv's bits, differ; else 0 (an int32 scalar)."""
        d = codes != given          # outside the tensor both are 0 (padding loads as 0 and quantizes to code 0)
        ds = ((scale_inv.to(tl.int32, bitcast=True) != given_s) & s_mask).to(tl.int32)
        if ROWWISE:
            ds = tl.max(ds, axis=0)
        return tl.max(tl.max(d.to(tl.int32), axis=1), axis=0) | ds


def _expected(master: torch.Tensor, block_shape) -> tuple:
    bn, bk = block_shape
    return tuple(master.shape[:-2]) + (-(-master.shape[-2] // bn), -(-master.shape[-1] // bk))


def requantize_mismatch(masters, codes, scales, block_shape=WEIGHT_BLOCK, *, pow2: bool = False,
                        amax_epsilon: float = 0.0, fp8_dtype: torch.dtype = E4M3,
                        variant: str | None = None) -> torch.Tensor:
    """flags[i] (a bool tensor on the masters' device, no host sync) = the trainer bytes `codes[i]` / `scales[i]`
    are not the recipe applied to `masters[i]`: exactly `not (bits_equal(q, codes[i]) and bits_equal(s,
    scales[i]))` with `(q, s) = quantize_blockwise(masters[i], block_shape, pow2=pow2, amax_epsilon=amax_epsilon,
    fp8_dtype=fp8_dtype)` -- a shape or dtype that differs is a mismatch (known on the host, no kernel work), and
    `scales[i] = None` compares the codes only.  Masters: bf16, fp16 or fp32, 2D or with leading (expert) dims,
    any strides; codes and scales any strides; all on one device (CUDA, or CPU under TRITON_INTERPRET=1).
    `variant`: the quantizer's launch variant (rows per program, warps); it never changes the flags."""
    if triton is None:
        raise ImportError("requantize_mismatch needs Triton; without it compare recipe.quantize_weight(master) "
                          "with harness.formats.bytes.bits_equal")
    if not (len(masters) == len(codes) == len(scales)):
        raise ValueError(f"{len(masters)} masters, {len(codes)} codes, {len(scales)} scales: one of each per tensor")
    if not masters:
        return torch.zeros(0, dtype=torch.bool)
    device = masters[0].device
    for m, q, s in zip(masters, codes, scales):
        tb.check_inputs(m, fp8_dtype)
        if any(t is not None and t.device != device for t in (m, q, s)):
            raise ValueError(f"requantize_mismatch: every tensor on {device}, got {m.device} / {q.device} / "
                             f"{s.device if s is not None else None}")
    bn, bk = block_shape
    bk2 = tb._p2(bk)
    # (rows per work item, rows per tile, warps) by layout class, from the quantizer's plan: a block that cannot be
    # loaded as 16-byte vectors is walked in 32-row slices (as one scalar-loaded tile it took all registers)
    tiling = {2: tb.plan(block_shape, variant)[:3], 1: tb.plan(block_shape, variant, slice_rows=32)[:3]}
    tiling[0] = tiling[1]
    init = [0] * len(masters)
    groups: dict = {}                      # (dtype, LAYOUT, EVEN) -> [(master, codes, scale, row fields)]
    for i, (m, q, s) in enumerate(zip(masters, codes, scales)):
        grid = _expected(m, block_shape)
        if q.shape != m.shape or q.dtype != fp8_dtype or (s is not None and (tuple(s.shape) != grid
                                                                            or s.dtype != torch.float32)):
            init[i] = 1                    # bits_equal is False on a shape or dtype alone
            continue
        if m.numel() == 0:
            continue
        n, k = m.shape[-2:]
        gk = grid[-1]
        unit = m.stride(-1) == 1 and q.stride(-1) == 1
        pitched = unit and k % 16 == 0 and (m.stride(-2) * m.element_size()) % 16 == 0 and q.stride(-2) % 16 == 0
        for lead in itertools.product(*(range(d) for d in m.shape[:-2])):
            mo = sum(j * st for j, st in zip(lead, m.stride()))
            qo = sum(j * st for j, st in zip(lead, q.stride()))
            so = sum(j * st for j, st in zip(lead, s.stride())) if s is not None else 0
            aligned = (pitched and m.data_ptr() % 16 == 0 and q.data_ptr() % 16 == 0
                       and (mo * m.element_size()) % 16 == 0 and qo % 16 == 0)
            layout = 2 if aligned else int(unit)
            rows, sub = tiling[layout][:2]
            if max(rows * abs(m.stride(-2)) + bk2 * abs(m.stride(-1)),
                   rows * abs(q.stride(-2)) + bk2 * abs(q.stride(-1))) >= 2 ** 31:
                raise ValueError(f"a {rows}x{bk} tile of tensor {i} spans more than 2^31 elements")
            even = sub >= rows and bk2 == bk and n % rows == 0 and k % bk == 0 and tb._p2(rows) == rows
            groups.setdefault((m.dtype, layout, even), []).append((m, q, s, mo, qo, so, n, k, gk, -(-n // rows), i))
    flags = torch.tensor(init, dtype=torch.uint8)
    if device.type == "cuda":
        flags = flags.pin_memory()
    flags = flags.to(device, non_blocking=True)
    if not groups:
        return flags.view(torch.bool)
    eps_consts = {}
    launches, rows_out, start = [], [], 0
    for (dtype, layout, even), items in groups.items():
        x0, q0 = items[0][0], items[0][1]
        s0 = next((it[2] for it in items if it[2] is not None), None)
        xb, qb = x0.data_ptr(), q0.data_ptr()
        sb = s0.data_ptr() if s0 is not None else 0
        esz = x0.element_size()
        begin = start
        for m, q, s, mo, qo, so, n, k, gk, row_tiles, i in items:
            xo = (m.data_ptr() - xb) // esz + mo
            qo = q.data_ptr() - qb + qo
            so = (s.data_ptr() - sb) // 4 + so if s is not None else 0
            rows_out.append([xo, qo, so, n, k, m.stride(-2), m.stride(-1), q.stride(-2), q.stride(-1),
                             s.stride(-2) if s is not None else 0, s.stride(-1) if s is not None else 0,
                             gk, row_tiles, start, i, s is not None])
            start += row_tiles * gk
        launches.append((dtype, layout, even, x0, q0, s0, begin, start - begin))
        eps_consts[dtype] = tb.format_constants(dtype, fp8_dtype, float(amax_epsilon))
    host = torch.tensor(rows_out, dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    table = host.to(device, non_blocking=True)               # the batch's one table copy
    piece = torch.repeat_interleave(torch.arange(len(rows_out), device=device, dtype=torch.int32),
                                    table[:, 12] * table[:, 11], output_size=start)
    dummy = torch.zeros(1, dtype=torch.int32, device=device)
    hw = device.type == "cuda"
    with torch.cuda.device(device) if hw else contextlib.nullcontext():
        for dtype, layout, even, x0, q0, s0, begin, programs in launches:
            eps32, consts = eps_consts[dtype]
            rows, sub, warps = tiling[layout]
            _requantize_kernel[(programs,)](
                table, piece, flags, x0.view(tb._RAW[dtype]), q0.view(torch.uint8),
                s0.view(torch.int32) if s0 is not None else dummy, eps32, int(bool(pow2)), begin, ROW=ROW,
                IN_KIND=tb._IN_KIND[dtype], VEC=16 // x0.element_size(), LAYOUT=layout, EVEN=even, BN=bn, BK=bk,
                ROWS=rows, SUB=sub, BK_P2=bk2, HW_CAST=hw, num_warps=warps, **consts)
    return flags.view(torch.bool)
