"""Transformer Engine's rule for an all-zero block, screened over a whole model's FP8 weights at once: a block whose
codes are all zero (+0 or -0: every byte 0x00 or 0x80) had amax 0, and TE gives it scale 1, so its scale_inv must be
exactly 1 (S3). On a GPU one Triton launch screens every tensor through a pointer table, with no full-size
temporary, reading a block's first row and the rest only where that row is all zero (a model's codes are read
about once per 128 rows, not whole); elsewhere, and where a tensor does not fit the kernel, the torch reference
below."""
from __future__ import annotations

import contextlib

import torch

from .blockwise import pad_blocks

try:
    import triton
    import triton.language as tl
except ImportError:                     # the reference serves
    triton = tl = None

ROW = 7                                 # codes (word offset from base), scale address, N, K words, gk, first program, output
# neighbouring blocks of one block row a program screens (a power of two): their first row is one contiguous read.
# The launch and the host copy bound the screen, not its programs (bench/gpu_bench.py times it)
BLOCKS_PER_PROGRAM = 8


def wrong_zero_blocks(codes: torch.Tensor, scale_inv: torch.Tensor, block_shape) -> torch.Tensor:
    """[gn, gk] bool: the block's codes are all zero and its scale_inv is not exactly 1 (NaN included)."""
    zero = pad_blocks(codes.view(torch.uint8) & 0x7F, block_shape).amax(dim=(1, 3)) == 0
    return zero & (scale_inv.float() != 1.0)


if triton is not None:
    @triton.jit
    def _zero_block_kernel(table_ptr, prog_ptr, out_ptr, base_ptr, ROW: tl.constexpr, BN: tl.constexpr,
                           BKW: tl.constexpr, G: tl.constexpr, VEC: tl.constexpr):
        """G neighbouring blocks of one block row of one tensor: rows [bi*BN, +BN), block columns [gj*G, +G), each
        BKW words wide (the codes viewed as int32 words)."""
        pid = tl.program_id(0).to(tl.int64)
        t = tl.load(prog_ptr + pid)
        row = table_ptr + t * ROW
        off = tl.load(row)
        n = tl.load(row + 2)
        kw = tl.load(row + 3)
        gk = tl.load(row + 4)
        p = pid - tl.load(row + 5)
        groups = (gk + G - 1) // G
        bi = p // groups
        j = (p - bi * groups) * G + tl.arange(0, G)                      # the G blocks' columns in the grid
        c = j[:, None] * BKW + tl.arange(0, BKW)[None, :]                # [G, BKW] word columns
        cm = c < kw
        if VEC:
            off = tl.multiple_of(off, 4)
            kw = tl.multiple_of(kw, 4)
        s = tl.load(tl.load(row + 1).to(tl.pointer_type(tl.float32)) + bi * gk + j, mask=j < gk, other=1.0)
        # the blocks' first row first, one contiguous read across the G blocks: a trained weight's block has a
        # nonzero code there, and then the rule holds whatever the rest is (the block is not all zero), so ~1/BN of
        # the codes is read; the other rows only where some block's first row is all zero and its scale is not 1
        r0 = bi * BN
        w = tl.load(base_ptr + off + r0 * kw + c, mask=cm, other=0)
        nz = tl.max(((w & 0x7F7F7F7F) != 0).to(tl.int32), axis=1)       # [G]
        if tl.max(((nz == 0) & (s != 1.0)).to(tl.int32), axis=0) > 0:
            for r in range(1, BN):
                rr = tl.minimum(r0 + r, n - 1)      # past a partial block's last row: that row again (harmless)
                w = tl.load(base_ptr + off + rr * kw + c, mask=cm, other=0)
                nz = nz | tl.max(((w & 0x7F7F7F7F) != 0).to(tl.int32), axis=1)
        tl.store(out_ptr + pid, tl.max(((nz == 0) & (s != 1.0)).to(tl.int32), axis=0))


def _fits_kernel(codes: torch.Tensor, scale_inv: torch.Tensor, block_shape) -> bool:
    bn, bk = block_shape
    return (codes.is_cuda and codes.dim() == 2 and codes.is_contiguous() and codes.element_size() == 1
            and codes.data_ptr() % 4 == 0 and codes.shape[1] % 4 == 0 and bk % 4 == 0 and bn & (bn - 1) == 0
            and (bk // 4) & (bk // 4 - 1) == 0 and scale_inv.dtype == torch.float32 and scale_inv.is_contiguous()
            and scale_inv.device == codes.device)


def _kernel_flags(pairs: list, block_shape) -> torch.Tensor:
    """Per pair, whether some block is wrong: a bool vector on the pairs' device (one launch per alignment)."""
    bn, bk = block_shape
    device = pairs[0][0].device
    out = torch.zeros(len(pairs), dtype=torch.int32, device=device)
    base = torch.zeros(4, dtype=torch.int32, device=device)                # an aligned anchor for word offsets
    for vec in (True, False):
        rows, progs, total = [], [], 0
        for i, (q, s) in enumerate(pairs):
            if (q.data_ptr() % 16 == 0 and q.shape[1] % 16 == 0) != vec:
                continue
            n, k = q.shape
            gn, gk = -(-n // bn), -(-k // bk)
            if gn * gk == 0:
                continue
            rows.append([(q.data_ptr() - base.data_ptr()) // 4, s.data_ptr(), n, k // 4, gk, total, i])
            progs.append(gn * -(-gk // BLOCKS_PER_PROGRAM))
            total += progs[-1]
        if not rows:
            continue
        table = torch.tensor(rows, dtype=torch.int64).to(device)
        prog = torch.repeat_interleave(torch.arange(len(rows), device=device),
                                       torch.tensor(progs, device=device), output_size=total)
        hit = torch.empty(total, dtype=torch.int32, device=device)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _zero_block_kernel[(total,)](table, prog, hit, base, ROW=ROW, BN=bn, BKW=bk // 4, G=BLOCKS_PER_PROGRAM,
                                         VEC=vec, num_warps=4)
        out.index_add_(0, table[:, 6][prog], hit)
    return out > 0


def zero_block_flags(pairs: list, block_shape, flag_of=None) -> list:
    """For each (codes, scale_inv) pair, whether some all-zero block has a scale_inv other than 1, as a 0-d bool
    tensor on the pair's device (no host sync: `harness.bitview.resolve` brings a check's flags over at once);
    `flag_of(vector, k)` makes the kernel's flags instead of a 0-d view each (`harness.bitview.FlagOf`)."""
    out: list = [None] * len(pairs)
    kernel = [i for i, (q, s) in enumerate(pairs) if triton is not None and _fits_kernel(q, s, block_shape)]
    by_device: dict = {}
    for i in kernel:
        by_device.setdefault(pairs[i][0].device, []).append(i)
    for ix in by_device.values():
        flags = _kernel_flags([pairs[i] for i in ix], block_shape)
        for k, i in enumerate(ix):
            out[i] = flag_of(flags, k) if flag_of is not None else flags[k]
    for i, (q, s) in enumerate(pairs):
        if out[i] is None:
            out[i] = wrong_zero_blocks(q, s, block_shape).any()
    return out
