"""The state digest of `harness.digest` as a Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

A pointer table, so that a whole engine's parameters (hundreds to thousands of tensors) cost a few launches, not
one to three Python launches per tensor; and pieces at word offsets, so that a fused parameter's digest is computed from the
checkpoint tensors it is made of without building it (`harness.digest.assembled_digests`).

Work is cut by the definition's blocks of BLOCK words: a program computes BLOCKS_PER_PROGRAM consecutive blocks'
sums for one piece (the words of each block that the piece covers; the rest, and blocks past the piece's end, are
masked to zero, which fmix32 keeps neutral), multiplies each by its block's Q_j and writes one uint32 per lane. The partial sums are added per output tensor on the device
(index_add_ into int64: exact, then mod 2^32) and copied to the host once. P_j comes from a 64 KiB table that
stays in the cache; its loads cost L1 bandwidth, not arithmetic (hashing every word's position instead would make
the kernel ALU-bound rather than memory-bound: `harness.digest`, why the multiplier factors through blocks).

One int64 row per piece -- source, units, first program, first word, output, programs, first block -- goes to
the device in one copy. Three kinds of piece, one launch each (per sentinel element size): VEC, whole groups of
4 words whose source is 16-byte aligned and whose first word is a multiple of 4, addressed as a word offset from
the table's own (aligned) pointer so that the compiler can prove alignment and issue 16-byte loads (an address
loaded from memory is only known to be 4-byte aligned); WORD, the other word-aligned pieces; BYTES, a source
that does not start on a 4-byte boundary or the last partial word of one, read as bytes and assembled into words.
With SENT set, each program also counts the elements of SENT bytes whose every byte is the poison byte 0xFF
(S1's question: did a poisoned destination survive), in the same pass.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from .digest_words import BLOCK_WORDS, MASK32, block_table
from .formats.bytes import as_bytes

try:
    import triton
    import triton.language as tl
except ImportError as _e:
    triton = tl = None
    _IMPORT_ERROR = _e

BLOCK = BLOCK_WORDS            # words per block of the definition
# blocks a program sums (a kept plan is for one value: see _plan_key); any count gives the same sums, one is the
# default because it was the fastest (`bench/gpu_bench.py --digest` measures it; its figures live in
# benchmarks/results, not here)
BLOCKS_PER_PROGRAM = 1
ROW = 7                        # source, units, first program, first word, output, programs, first block
VEC, WORD, BYTES = 0, 1, 2

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
    def _lane(f, p_ptr, r, k, J: tl.constexpr, KEY: tl.constexpr, BLOCK: tl.constexpr):
        p = tl.load(p_ptr + J * BLOCK + r).to(tl.uint32, bitcast=True)
        lo = (k & 0xFFFFFFFF).to(tl.uint32)
        hi = (k >> 32).to(tl.uint32)
        q = (_fmix32(lo ^ KEY ^ _fmix32(hi ^ KEY)) << 1) | 1          # Q_j[k]: one scalar per block
        return tl.sum(f * p, axis=0) * q

    @triton.jit
    def _sentinels(w, valid, SENT: tl.constexpr):
        """Elements of SENT bytes in word w whose every byte is 0xFF (w holds 4 // SENT of them)."""
        x = ~w
        if SENT == 4:
            hit = (x == 0).to(tl.int32)
        elif SENT == 2:
            hit = ((x & 0xFFFF) == 0).to(tl.int32) + ((x >> 16) == 0).to(tl.int32)
        else:
            hit = (((x & 0xFF) == 0).to(tl.int32) + (((x >> 8) & 0xFF) == 0).to(tl.int32)
                   + (((x >> 16) & 0xFF) == 0).to(tl.int32) + ((x >> 24) == 0).to(tl.int32))
        return tl.sum(tl.where(valid, hit, 0), axis=0)

    @triton.jit
    def _block(p_ptr, src, n_units, first, k, r, BLOCK: tl.constexpr, KIND: tl.constexpr, SENT: tl.constexpr):
        """Block k of a piece: its words' lane sums times Q_j[k], and with SENT the count of all-0xFF elements of
        SENT bytes among them; zero for a block past the piece's end (every word masked)."""
        # 64-bit arithmetic once per block (word indices pass 2^32 in a 16 GiB tensor); the per-word indices and
        # the mask in 32 bits: int64 vector math costs several instructions a word
        start = k * BLOCK
        shift = start - first                      # the piece's word at this block's position 0
        words = (n_units + 3) // 4 if KIND == 2 else n_units
        lo = tl.minimum(tl.maximum(-shift, 0), BLOCK).to(tl.int32)
        hi = tl.minimum(tl.maximum(words - shift, 0), BLOCK).to(tl.int32)
        if KIND == 0:
            # words [first, first + n_units) at word offset src from p_ptr: all multiples of 4 (the plan's
            # promise), so the loads below are 16-byte vectors
            lo = tl.multiple_of(lo, 4)
            hi = tl.multiple_of(hi, 4)
            valid = (r >= lo) & (r < hi)
            w = tl.load(p_ptr + tl.multiple_of(src + shift, 4) + r, mask=valid, other=0).to(tl.uint32, bitcast=True)
        elif KIND == 1:
            valid = (r >= lo) & (r < hi)
            w = tl.load(src.to(tl.pointer_type(tl.int32)) + shift + r, mask=valid, other=0).to(tl.uint32,
                                                                                               bitcast=True)
        else:
            lane = tl.arange(0, 4)
            nb = tl.minimum(tl.maximum(n_units - shift * 4, 0), 4 * BLOCK).to(tl.int32)   # bytes left from 0
            boff = r[:, None] * 4 + lane[None, :]
            ok = (r[:, None] >= lo) & (boff < nb)
            b = tl.load(src.to(tl.pointer_type(tl.uint8)) + shift * 4 + boff, mask=ok, other=0).to(tl.uint32)
            w = tl.sum(b << (lane * 8).to(tl.uint32)[None, :], axis=1)      # disjoint bits: sum == or
            valid = (r >= lo) & (r < hi)
        f = _fmix32(w)
        s0 = _lane(f, p_ptr, r, k, 0, 0x9E3779B9, BLOCK)
        s1 = _lane(f, p_ptr, r, k, 1, 0x85EBCA6B, BLOCK)
        s2 = _lane(f, p_ptr, r, k, 2, 0xC2B2AE35, BLOCK)
        s3 = _lane(f, p_ptr, r, k, 3, 0x27D4EB2F, BLOCK)
        if SENT > 0:
            c = _sentinels(w, valid, SENT)
        else:
            c = 0
        return s0, s1, s2, s3, c

    @triton.jit
    def _table_kernel(table_ptr, piece_ptr, part_ptr, p_ptr, pid0, ROW: tl.constexpr, BLOCK: tl.constexpr,
                      KIND: tl.constexpr, SENT: tl.constexpr, G: tl.constexpr):
        """Blocks k0 .. k0 + G - 1 of program pid0 + program_id's piece, summed: lane sums of the piece's words in
        each block times that block's Q_j[k] (and with SENT, the count of all-0xFF elements of SENT bytes). G > 1
        pays the table lookups once for G blocks and shares the multiplier table's loads (sm90 PTX loads it once);
        any G gives the same sums (BLOCKS_PER_PROGRAM picks it)."""
        pid = pid0 + tl.program_id(0).to(tl.int64)
        row = table_ptr + tl.load(piece_ptr + pid) * ROW
        src = tl.load(row)
        n_units = tl.load(row + 1)
        first = tl.load(row + 3)
        k0 = tl.load(row + 6) + (pid - tl.load(row + 2)) * G
        r = tl.arange(0, BLOCK)
        s0, s1, s2, s3, c = _block(p_ptr, src, n_units, first, k0, r, BLOCK, KIND, SENT)
        for g in tl.static_range(1, G):
            t0, t1, t2, t3, tc = _block(p_ptr, src, n_units, first, k0 + g, r, BLOCK, KIND, SENT)
            s0 += t0
            s1 += t1
            s2 += t2
            s3 += t3
            c += tc
        out = part_ptr + pid * 5
        tl.store(out + 0, s0.to(tl.int32, bitcast=True))
        tl.store(out + 1, s1.to(tl.int32, bitcast=True))
        tl.store(out + 2, s2.to(tl.int32, bitcast=True))
        tl.store(out + 3, s3.to(tl.int32, bitcast=True))
        if SENT > 0:
            tl.store(out + 4, c)


def _pieces(b: torch.Tensor, first: int, base_addr: int):
    """(kind, source, units, first word) pieces of the byte tensor b placed at word `first`: 16-byte-aligned whole
    groups of 4 words (VEC; source as a word offset from base_addr), then the remaining whole words (WORD), then
    the last partial word; all of it as bytes where it does not start on a 4-byte boundary."""
    n = b.numel()
    if n == 0:
        return []
    addr = b.data_ptr()
    if addr % 4:
        return [(BYTES, addr, n, first)]
    n4, out = n // 4, []
    vec = n4 - n4 % 4 if addr % 16 == 0 and first % 4 == 0 else 0
    if vec:
        out.append((VEC, (addr - base_addr) // 4, vec, first))
    if n4 > vec:
        out.append((WORD, addr + 4 * vec, n4 - vec, first + vec))
    if n % 4:
        out.append((BYTES, addr + 4 * n4, n % 4, first + n4))
    return out


def _blocks(kind: int, units: int, first: int) -> tuple[int, int]:
    """(first block, programs) of a piece: the definition's blocks its words touch, BLOCKS_PER_PROGRAM a
    program."""
    words = -(-units // 4) if kind == BYTES else units
    k0 = first // BLOCK
    return k0, -(-((first + words - 1) // BLOCK - k0 + 1) // BLOCKS_PER_PROGRAM)


def plan(groups: list, sentinel_sizes: list | None = None, base_addr: int = 0):
    """(launches, rows, sources): launches = [(kind, sentinel size, first program, programs)], at most one per kind
    and sentinel size whatever the number of tensors; rows = one [source, units, first program, first word, output,
    programs, first block] per piece; sources = the byte tensors the rows point into (alive until the kernels are
    enqueued: `as_bytes` copies a strided tensor). `groups[o]` is output o's pieces, (tensor, first word) each;
    `sentinel_sizes[o]`: its element size (1, 2 or 4) to count all-0xFF elements of, or None."""
    sources, by_kind = [], {}
    for o, group in enumerate(groups):
        sent = sentinel_sizes[o] if sentinel_sizes is not None else 0
        for t, first in group:
            b = as_bytes(t)
            sources.append(b)
            for kind, src, units, w0 in _pieces(b, first, base_addr):
                k0, p = _blocks(kind, units, w0)
                by_kind.setdefault((kind, sent), []).append((src, units, w0, o, p, k0))
    launches, rows, start = [], [], 0
    for key in sorted(by_kind):
        begin = start
        for src, units, w0, o, p, k0 in by_kind[key]:
            rows.append([src, units, start, w0, o, p, k0])
            start += p
        launches.append((key[0], key[1], begin, start - begin))
    return launches, rows, sources


# Plans kept by what they are a function of: every piece's address, byte count and first word, the sentinel sizes
# and the block table's address. An engine's parameters (and, mostly, a trainer's export) lie at the same addresses
# sync after sync, and planning them -- a byte view and the piece split per tensor, the table's copy to the device,
# the program index -- is host work per tensor that a kept plan does once. A plan holds addresses only: whatever
# tensor lies there when it runs is what is read.
PLANS_KEPT = 8
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()


def _plan_key(groups: list, sentinel_sizes: list | None, p: torch.Tensor, keep_plans: bool | None = None):
    """The plan's key, or None where the plan is not kept: `keep_plans` False, or None (production) off CUDA, or a
    piece that is not one stride-1 run of its own bytes (`as_bytes` would copy it: a plan would point at the
    copy)."""
    if not (p.device.type == "cuda" if keep_plans is None else keep_plans):
        return None
    key = [p.data_ptr(), BLOCKS_PER_PROGRAM, None if sentinel_sizes is None else tuple(sentinel_sizes)]
    for group in groups:
        for t, first in group:
            if not t.is_contiguous():
                return None
            key.append((t.data_ptr(), t.nbytes, first))
        key.append(None)                                     # where an output's pieces end
    return tuple(key)


def lane_sums_pieces(groups: list, sentinel_sizes: list | None = None, keep_plans: bool | None = None):
    """(sums, sentinels): [(S_0, S_1, S_2, S_3)] per output (all pieces on one device), and per output whether
    some element is all 0xFF bytes (None without `sentinel_sizes`). One copy to the device (the table), a launch
    per kind of piece, one copy to the host for the whole batch. `keep_plans`: keep this batch's plan for the
    next batch at the same addresses -- None (production): on CUDA only; True: on any device (the interpreter's
    CPU tensors take the GPU's path); False: never. The sums are the same either way."""
    return start_lane_sums_pieces(groups, sentinel_sizes, keep_plans)()


def start_lane_sums_pieces(groups: list, sentinel_sizes: list | None = None, keep_plans: bool | None = None):
    """`lane_sums_pieces` with the kernels enqueued now and the host copy when the returned function is called:
    the caller's host work in between overlaps the device's (the vLLM worker reads its record meanwhile)."""
    if triton is None:
        raise ImportError(f"harness.digest_triton needs Triton ({_IMPORT_ERROR})")
    if not groups:
        return lambda: ([], None if sentinel_sizes is None else [])
    device = next((t.device for g in groups for t, _ in g), torch.device("cpu"))
    p = block_table(device)
    zero = [(0, 0, 0, 0)] * len(groups), None if sentinel_sizes is None else [False] * len(groups)
    key = _plan_key(groups, sentinel_sizes, p, keep_plans)
    with _PLANS_LOCK:                  # the capture's expected side runs in a thread beside the wire's digests
        hit = _PLANS.get(key) if key is not None else None
    sources = None
    if hit is None:
        launches, rows, sources = plan(groups, sentinel_sizes, p.data_ptr())
        if not launches:                                     # only empty tensors
            return lambda: zero
        # the batch's one host-to-device copy (a few KiB: pinning it would cost more than the copy)
        table = torch.tensor(rows, dtype=torch.int64).to(device)
        total = launches[-1][2] + launches[-1][3]
        piece = torch.repeat_interleave(torch.arange(len(rows), device=device), table[:, 5], output_size=total)
        hit = (launches, table, piece, table[:, 4][piece], total)
        if key is not None:
            with _PLANS_LOCK:
                while len(_PLANS) >= PLANS_KEPT:
                    _PLANS.pop(next(iter(_PLANS)))
                _PLANS[key] = hit
    launches, table, piece, output_of, total = hit
    parts = torch.zeros((total, 5), dtype=torch.int32, device=device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for kind, sent, begin, programs in launches:          # Triton launches on the current device
            _table_kernel[(programs,)](table, piece, parts, p, begin, ROW=ROW, BLOCK=BLOCK, KIND=kind, SENT=sent,
                                       G=BLOCKS_PER_PROGRAM, num_warps=8)
    wide = parts.to(torch.int64)
    wide[:, :4] &= MASK32                                    # uint32 partials; a sum of < 2^31 of them fits
    sums = torch.zeros((len(groups), 5), dtype=torch.int64, device=device)
    sums.index_add_(0, output_of, wide)
    del sources                                              # the kernels are enqueued

    def finish():
        got = sums.cpu().tolist()
        return ([tuple(int(v) & MASK32 for v in r[:4]) for r in got],
                None if sentinel_sizes is None else [r[4] > 0 for r in got])
    return finish


def lane_sums_batched(tensors: list, base_word: int = 0, keep_plans: bool | None = None) -> list:
    """[(S_0, S_1, S_2, S_3)] for each tensor (all on one device); `base_word` offsets the word indices (tests
    reach indices >= 2^32 with it); `keep_plans` as in `lane_sums_pieces`."""
    return lane_sums_pieces([[(t, base_word)] for t in tensors], keep_plans=keep_plans)[0]
