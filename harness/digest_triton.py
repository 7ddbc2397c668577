"""The state digest of `harness.digest` as a Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

Each program reads BLOCK words once, whitens them (fmix32), computes its multipliers in-kernel from the word
indices (no tables, no int64 copy of the tensor) and writes one uint32 partial sum per lane; partial sums of all
tensors of a batch are reduced on the device (no host sync per tensor) and copied to the host once.
Word-aligned tensors are read as uint32 words (whole blocks unmasked, then the last partial block and the last
partial word as two tiny launches; the sums add); tensors whose bytes do not start on a 4-byte boundary are read
as bytes and assembled into words in-kernel (same words, so the same sums).  uint32 arithmetic wraps mod 2^32 on
the GPU and in the interpreter alike.
"""
from __future__ import annotations

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
        c = _fmix32(hi ^ KEY) ^ KEY                   # per program: hi32(i) is constant over a block
        m = (_fmix32(lo ^ c) << 1) | 1
        return tl.sum(f * m, axis=0)

    @triton.jit
    def _digest_kernel(src_ptr, part_ptr, n_units, base_word, BLOCK: tl.constexpr, BYTES: tl.constexpr,
                       MASKED: tl.constexpr):
        """Partial lane sums of words [base_word + pid*BLOCK, +BLOCK).  BYTES: src is uint8 and n_units counts
        bytes (zero padding of the last word comes from the load mask); else src is int32 words.  MASKED=False
        for whole blocks: unmasked loads vectorize whatever n_units is."""
        pid = tl.program_id(0).to(tl.int64)
        w_idx = pid * BLOCK + tl.arange(0, BLOCK)
        if BYTES:
            lane = tl.arange(0, 4)
            boff = w_idx[:, None] * 4 + lane[None, :]
            b = tl.load(src_ptr + boff, mask=boff < n_units, other=0).to(tl.uint32)
            w = tl.sum(b << (lane * 8).to(tl.uint32)[None, :], axis=1)      # disjoint bits: sum == or
        elif MASKED:
            w = tl.load(src_ptr + w_idx, mask=w_idx < n_units, other=0).to(tl.uint32, bitcast=True)
        else:
            w = tl.load(src_ptr + w_idx).to(tl.uint32, bitcast=True)
        f = _fmix32(w)
        first = base_word + pid * BLOCK
        hi = (first >> 32).to(tl.uint32)
        lo = ((first & 0xFFFFFFFF) + tl.arange(0, BLOCK)).to(tl.uint32)   # a block never crosses 2^32
        out = part_ptr + pid * 4
        tl.store(out + 0, _lane(f, lo, hi, 0x9E3779B9).to(tl.int32, bitcast=True))
        tl.store(out + 1, _lane(f, lo, hi, 0x85EBCA6B).to(tl.int32, bitcast=True))
        tl.store(out + 2, _lane(f, lo, hi, 0xC2B2AE35).to(tl.int32, bitcast=True))
        tl.store(out + 3, _lane(f, lo, hi, 0x27D4EB2F).to(tl.int32, bitcast=True))


def _launches(b: torch.Tensor, base_word: int = 0):
    """(source, units, base word, BYTES, MASKED) launches covering the byte tensor b, whose first byte is byte
    4 * base_word of the tensor: whole blocks of words, the last partial block, the last partial word."""
    n = b.numel()
    if n == 0:
        return []
    if b.data_ptr() % 4:
        return [(b, n, base_word, True, True)]
    n4 = n // 4
    full = n4 // BLOCK * BLOCK
    words = b[:4 * n4].view(torch.int32)
    out = []
    if full:
        out.append((words[:full], full, base_word, False, False))
    if n4 > full:
        out.append((words[full:], n4 - full, base_word + full, False, True))
    if n % 4:
        out.append((b[4 * n4:], n % 4, base_word + n4, True, True))
    return out


def _programs(units: int, as_bytes_: bool) -> int:
    words = -(-units // 4) if as_bytes_ else units
    return -(-words // BLOCK)


def lane_sums_batched(tensors: list, base_word: int = 0) -> list:
    """[(S_0, S_1, S_2, S_3)] for each tensor (all on one device); one host copy for the whole batch.
    `base_word` offsets the word indices (tests reach indices >= 2^32 with it)."""
    if triton is None:
        raise ImportError(f"harness.digest_triton needs Triton ({_IMPORT_ERROR})")
    if not tensors:
        return []
    device = tensors[0].device
    plan = [(ti, l) for ti, t in enumerate(tensors) for l in _launches(as_bytes(t), base_word)]
    if not plan:                                             # only empty tensors
        return [(0, 0, 0, 0)] * len(tensors)
    counts = [_programs(units, byt) for _, (_, units, _, byt, _) in plan]
    parts = torch.empty((sum(counts), 4), dtype=torch.int32, device=device)
    spans = [[0, 0] for _ in tensors]                        # each tensor's rows of `parts` are contiguous
    row = 0
    for (ti, (src, units, base, byt, masked)), p in zip(plan, counts):
        _digest_kernel[(p,)](src, parts[row:row + p], units, base, BLOCK=BLOCK, BYTES=byt, MASKED=masked,
                             num_warps=8)
        spans[ti] = [spans[ti][0] if spans[ti][1] else row, row + p]
        row += p
    wide = parts.to(torch.int64) & MASK32                    # uint32 partials; a sum of < 2^31 of them fits
    sums = torch.stack([wide[a:b].sum(0) if b > a else wide.new_zeros(4) for a, b in spans])
    return [tuple(int(v) & MASK32 for v in r) for r in sums.cpu().tolist()]
