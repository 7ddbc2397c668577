"""The state digest of `harness.digest` as a Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

A pointer table, so that a whole engine's parameters (147 to 3127 tensors) cost two launches, not one to three
Python launches per tensor.  The batch is cut into pieces (`plan`): the whole words of each tensor whose bytes
start on a 4-byte boundary (word pieces), and, read as bytes and assembled into words in-kernel, a tensor that
does not start on one or the last partial word of one that does (byte pieces; same words, so the same sums).
One int64 row per piece -- source address, units (words or bytes), first program, first word index, tensor,
programs -- goes to the device in one copy; one launch covers all word pieces, one all byte pieces.  Program p reads its
piece's index from a per-program array (`repeat_interleave` on the device: no search in the kernel), casts the
loaded address to a pointer (the grouped-GEMM tutorial's pattern; Triton's interpreter runs it too, so the CPU
suite tests this very path), reads BLOCK words once (masked by the piece's size), whitens them (fmix32),
computes its multipliers in-kernel from the word indices (no tables, no int64 copy of the tensor) and writes one
uint32 partial sum per lane.  The partial sums are added per tensor on the device (index_add_ into int64: exact,
then mod 2^32) and copied to the host once.  uint32 arithmetic wraps mod 2^32 on the GPU and in the interpreter.
An address loaded from the table is only known to be 4-byte aligned, so its loads are not vectorized the way a
kernel argument's are (no alignment hint is given: a wrong one faults); the launches saved are the point.
"""
from __future__ import annotations

import contextlib

import torch

from .digest_words import MASK32
from .formats.bytes import as_bytes

try:
    import triton
    import triton.language as tl
except ImportError as _e:
    triton = tl = None
    _IMPORT_ERROR = _e

BLOCK = 4096                   # words per program
ROW = 6                        # a table row: address, units, first program, first word, tensor, programs

if triton is not None:
    @triton.jit
    def _fmix32(h):
        h ^= h >> 16
        h *= 0x85EBCA6B
        h ^= h >> 13
        h *= 0xC2B2AE35
        h ^= h >> 16
        return h

    @triton.jit
    def _lane(f, lo, hi, KEY: tl.constexpr):
        c = _fmix32(hi ^ KEY) ^ KEY                   # hi32(i): one scalar per block unless CROSS
        m = (_fmix32(lo ^ c) << 1) | 1
        return tl.sum(f * m, axis=0)

    @triton.jit
    def _table_kernel(table_ptr, piece_ptr, part_ptr, pid0, ROW: tl.constexpr, BLOCK: tl.constexpr,
                      BYTES: tl.constexpr, CROSS: tl.constexpr):
        """Partial lane sums of program pid0 + program_id: block k of its piece, words [first + k*BLOCK, +BLOCK).
        BYTES: the piece's units are bytes (zero padding of the last word comes from the load mask); else int32
        words.  CROSS: some block of this launch straddles a multiple of 2^32 (a base word that is not a multiple
        of BLOCK; tests only), so hi32 is taken per word instead of once per block."""
        pid = pid0 + tl.program_id(0).to(tl.int64)
        row = table_ptr + tl.load(piece_ptr + pid) * ROW
        addr = tl.load(row)
        n_units = tl.load(row + 1)
        k = pid - tl.load(row + 2)                     # block of the piece
        first = tl.load(row + 3) + k * BLOCK
        w_idx = k * BLOCK + tl.arange(0, BLOCK)
        if BYTES:
            src = addr.to(tl.pointer_type(tl.uint8))
            lane = tl.arange(0, 4)
            boff = w_idx[:, None] * 4 + lane[None, :]
            b = tl.load(src + boff, mask=boff < n_units, other=0).to(tl.uint32)
            w = tl.sum(b << (lane * 8).to(tl.uint32)[None, :], axis=1)      # disjoint bits: sum == or
        else:
            src = addr.to(tl.pointer_type(tl.int32))
            w = tl.load(src + w_idx, mask=w_idx < n_units, other=0).to(tl.uint32, bitcast=True)
        f = _fmix32(w)
        if CROSS:
            idx = first + tl.arange(0, BLOCK)
            hi = (idx >> 32).to(tl.uint32)
            lo = (idx & 0xFFFFFFFF).to(tl.uint32)
        else:
            hi = (first >> 32).to(tl.uint32)
            lo = ((first & 0xFFFFFFFF) + tl.arange(0, BLOCK)).to(tl.uint32)   # the block stays below 2^32
        out = part_ptr + pid * 4
        tl.store(out + 0, _lane(f, lo, hi, 0x9E3779B9).to(tl.int32, bitcast=True))
        tl.store(out + 1, _lane(f, lo, hi, 0x85EBCA6B).to(tl.int32, bitcast=True))
        tl.store(out + 2, _lane(f, lo, hi, 0xC2B2AE35).to(tl.int32, bitcast=True))
        tl.store(out + 3, _lane(f, lo, hi, 0x27D4EB2F).to(tl.int32, bitcast=True))


def _pieces(b: torch.Tensor, base_word: int):
    """(source, units, first word index, BYTES) pieces of the byte tensor b: its whole words, then its last
    partial word; all of it as bytes where it does not start on a 4-byte boundary."""
    n = b.numel()
    if n == 0:
        return []
    if b.data_ptr() % 4:
        return [(b, n, base_word, True)]
    n4 = n // 4
    out = [(b, n4, base_word, False)] if n4 else []
    if n % 4:
        out.append((b[4 * n4:], n % 4, base_word + n4, True))
    return out


def _programs(units: int, as_bytes_: bool) -> int:
    words = -(-units // 4) if as_bytes_ else units
    return -(-words // BLOCK)


def _crosses(first: int, programs: int) -> bool:
    """Whether a block of words [first + k*BLOCK, +BLOCK), k < programs, straddles a multiple of 2^32."""
    boundary = ((first >> 32) + 1) << 32
    return first % BLOCK != 0 and boundary < first + programs * BLOCK


def plan(tensors: list, base_word: int = 0):
    """(launches, rows, sources): launches = [(BYTES, CROSS, first program, programs)], at most one per BYTES
    whatever the number of tensors; rows = one [address, units, first program, first word, tensor, programs]
    per piece, word pieces first; sources = the byte tensors the addresses point into (alive until the kernels are
    enqueued: `as_bytes` copies a strided tensor)."""
    sources, by_kind = [], {False: [], True: []}
    for ti, t in enumerate(tensors):
        b = as_bytes(t)
        sources.append(b)
        for src, units, first, byt in _pieces(b, base_word):
            by_kind[byt].append((src.data_ptr(), units, first, ti, _programs(units, byt)))
    launches, rows, start = [], [], 0
    for byt in (False, True):
        group = by_kind[byt]
        if not group:
            continue
        begin, cross = start, False
        for addr, units, first, ti, p in group:
            rows.append([addr, units, start, first, ti, p])
            cross = cross or _crosses(first, p)
            start += p
        launches.append((byt, cross, begin, start - begin))
    return launches, rows, sources


def lane_sums_batched(tensors: list, base_word: int = 0) -> list:
    """[(S_0, S_1, S_2, S_3)] for each tensor (all on one device); one copy to the device (the table), at most
    two launches, one copy to the host for the whole batch.  `base_word` offsets the word indices (tests reach
    indices >= 2^32 with it)."""
    if triton is None:
        raise ImportError(f"harness.digest_triton needs Triton ({_IMPORT_ERROR})")
    if not tensors:
        return []
    device = tensors[0].device
    launches, rows, sources = plan(tensors, base_word)
    if not launches:                                         # only empty tensors
        return [(0, 0, 0, 0)] * len(tensors)
    host = torch.tensor(rows, dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    table = host.to(device, non_blocking=True)               # the batch's one host-to-device copy
    total = launches[-1][2] + launches[-1][3]
    piece = torch.repeat_interleave(torch.arange(len(rows), device=device), table[:, 5], output_size=total)
    parts = torch.empty((total, 4), dtype=torch.int32, device=device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for byt, cross, begin, programs in launches:          # Triton launches on the current device
            _table_kernel[(programs,)](table, piece, parts, begin, ROW=ROW, BLOCK=BLOCK, BYTES=byt,
                                       CROSS=cross, num_warps=8)
    wide = parts.to(torch.int64) & MASK32                    # uint32 partials; a sum of < 2^31 of them fits
    sums = torch.zeros((len(tensors), 4), dtype=torch.int64, device=device)
    sums.index_add_(0, table[:, 4][piece], wide)
    del sources                                              # the kernels are enqueued
    return [tuple(int(v) & MASK32 for v in r) for r in sums.cpu().tolist()]

