"""Streaming state digests: one short string per tensor, identical on CPU (pure torch) and CUDA (Triton kernel).

Definition (every implementation here and the pure-Python oracle in tests/test_digest.py follow it exactly):

* bytes: the tensor's bytes in C order (`harness.formats.bytes.as_bytes`), zero-padded to a multiple of 4, read as
  little-endian uint32 words w_0 .. w_{n-1};
* fmix32 = MurmurHash3's finalizer: h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16
  (mod 2^32, logical shifts);
* four lanes j = 0..3, keys K = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F); multiplier
  m_ij = fmix32(lo32(i) ^ K_j ^ fmix32(hi32(i) ^ K_j)) * 2 + 1 (mod 2^32, always odd);
* lane sum S_j = sum_i fmix32(w_i) * m_ij mod 2^32;
* string f"fx:{dtype}:{'x'.join(shape) or 'scalar'}:{S_0:08x}{S_1:08x}{S_2:08x}{S_3:08x}" (dtype without
  "torch."); a meta tensor gives f"meta:{dtype}:{shape}" with the same shape spelling.

Why fmix32(w_i) and not w_i (the first draft of this definition): with w_i itself, bit 31 of a word reaches only
bit 31 of each lane sum (2^31 * m = 2^31 mod 2^32 for every odd m), so flipping bit 31 in any two words, e.g.
the signs of two fp32 values or negating an fp32 tensor with an even number of elements, left all four lanes
unchanged; more generally a difference confined to the top t bits of words was seen only through m mod 2^t.
fmix32 is a bijection, so a changed word still always changes every lane (m is odd), and its avalanche turns
structured differences into pseudo-random ones.  fmix32(0) = 0 keeps the zero padding neutral.

The sums are additive over words, so a tensor can be cut anywhere (chunks, programs, an unaligned tail) and the
parts added.  CPU: 1M-word chunks through reused buffers, multiplier tables of the first chunks cached.  CUDA:
`harness.digest_triton` (one partial sum per program and lane, multipliers computed in-kernel).
"""
from __future__ import annotations

import threading

import torch

from .digest_words import KEYS, MASK32  # noqa: F401 - the shared word constants (re-exported)
from .formats.bytes import as_bytes

CHUNK_WORDS = 1 << 20          # per-chunk buffers: a few MiB whatever the tensor size
CACHED_CHUNKS = 2              # multiplier tables kept for words [0, 2M) (grown on demand, at most 32 MiB)


def _s32(v: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits."""
    v &= MASK32
    return v - (1 << 32) if v >= 1 << 31 else v


_C1, _C2 = _s32(0x85EBCA6B), _s32(0xC2B2AE35)


def fmix32_int(h: int) -> int:
    """fmix32 on a Python int (scalars: the per-chunk hi32 part)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


_CONSTS: dict = {}


def _consts(device):
    """0-d int32 operands per device: tensor-tensor ops dispatch ~3x faster than tensor-scalar ones, which is
    most of the cost on small tensors."""
    key = str(device)
    c = _CONSTS.get(key)
    if c is None:
        mk = lambda v: torch.tensor(v, dtype=torch.int32, device=device)    # noqa: E731
        c = _CONSTS[key] = {"steps": [(mk(16), mk(0xFFFF), mk(_C1)), (mk(13), mk(0x7FFFF), mk(_C2)),
                                      (mk(16), mk(0xFFFF), None)], "one": mk(1)}
    return c


def _fmix32_(h: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """fmix32 in place on an int32 tensor (int32 multiply wraps mod 2^32; `>>` is arithmetic, so mask)."""
    for shift, mask, mult in _consts(h.device)["steps"]:
        torch.bitwise_right_shift(h, shift, out=tmp)
        tmp.bitwise_and_(mask)
        h.bitwise_xor_(tmp)
        if mult is not None:
            h.mul_(mult)
    return h


def lane_consts(base: int) -> tuple[int, ...]:
    """K_j ^ fmix32(hi32(i) ^ K_j) for word indices i in [base, base + CHUNK_WORDS): constant there (chunks never
    cross a 2^32 boundary)."""
    hi = base >> 32
    return tuple(k ^ fmix32_int(hi ^ k) for k in KEYS)


def multipliers(base: int, count: int, device="cpu", out=None) -> torch.Tensor:
    """m_ij for i in [base, base + count) (count <= CHUNK_WORDS, base a multiple of it), int32 [4, count].
    `out`: a [4, >= count] int32 buffer plus two [>= count] int32 work buffers, as a tuple."""
    assert base % CHUNK_WORDS == 0 and count <= CHUNK_WORDS
    if out is None:
        out = tuple(torch.empty(shape, dtype=torch.int32, device=device) for shape in ((4, count), count, count))
    out, tmp, lo = out[0][:, :count], out[1][:count], out[2][:count]
    torch.arange(count, out=lo)
    lo += _s32(base)                                    # lo32(i): base's low bits are below 2^32 - 2^20
    one = _consts(device)["one"]
    for j, c in enumerate(lane_consts(base)):
        torch.bitwise_xor(lo, _s32(c), out=out[j])
        _fmix32_(out[j], tmp)
        out[j].bitwise_left_shift_(one).bitwise_or_(one)
    return out


_MULT_CACHE: dict = {}


def _chunk_multipliers(base: int, count: int, device, out) -> torch.Tensor:
    """Multipliers of words [base, base + count): cached for the first CACHED_CHUNKS chunks (tables grow to the
    largest count asked for), else computed into `out` ([4, CHUNK_WORDS] scratch)."""
    c = base // CHUNK_WORDS
    if c >= CACHED_CHUNKS:
        return multipliers(base, count, device, out())
    key = (c, CHUNK_WORDS, str(device))
    m = _MULT_CACHE.get(key)
    if m is None or m.shape[1] < count:
        size = min(CHUNK_WORDS, max(count, 2 * (0 if m is None else m.shape[1]), 4096))
        m = _MULT_CACHE[key] = multipliers(base, size, device)
    return m[:, :count]


_SCRATCH = threading.local()


def _scratch(n: int, device):
    """Reused int32 buffers, grown to the largest chunk seen (a fresh multi-MiB allocation page-faults on every
    call): words, tmp, and lazily the buffers `multipliers` needs for chunks past the cached ones."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (str(device), CHUNK_WORDS)
    b = bufs.get(key)
    if b is None or b["words"].numel() < n:
        size = min(CHUNK_WORDS, max(n, 2 * (0 if b is None else b["words"].numel())))
        b = bufs[key] = {"words": torch.empty(size, dtype=torch.int32, device=device),
                         "tmp": torch.empty(size, dtype=torch.int32, device=device)}

    def table():
        if "table" not in b:
            b["table"] = tuple(torch.empty(shape, dtype=torch.int32, device=device)
                               for shape in ((4, CHUNK_WORDS), CHUNK_WORDS, CHUNK_WORDS))
        return b["table"]
    return b["words"], b["tmp"], table


def lane_sums(t: torch.Tensor) -> tuple[int, int, int, int]:
    """(S_0, S_1, S_2, S_3) with torch ops only (any device; the CPU path)."""
    b = as_bytes(t)
    nbytes = b.numel()
    sums = [0, 0, 0, 0]
    if nbytes == 0:
        return tuple(sums)
    words, tmp, table = _scratch(min(CHUNK_WORDS, -(-nbytes // 4)), b.device)
    on_cpu = b.device.type == "cpu"
    step = 4 * CHUNK_WORDS
    for s in range(0, nbytes, step):
        seg = b[s:s + step] if nbytes > step else b
        nb = seg.numel()
        n = -(-nb // 4)
        w = words[:n]
        if nb % 4 == 0 and seg.storage_offset() % 4 == 0:
            w.copy_(seg.view(torch.int32))               # the caller's tensor is never modified
        else:                                            # unaligned bytes or a zero-padded last word
            w[-1] = 0
            w.view(torch.uint8)[:nb].copy_(seg)
        _fmix32_(w, tmp[:n])
        m = _chunk_multipliers(s // 4, n, b.device, table)
        if on_cpu and n <= 1 << 15:                      # int32 mv / dot wrap mod 2^32: one pass, no temporary
            part = torch.mv(m, w).tolist()
        elif on_cpu:
            part = [int(torch.dot(w, m[j])) for j in range(4)]
        else:
            part = [int(torch.mul(w, m[j], out=tmp[:n]).sum(dtype=torch.int64)) for j in range(4)]
        sums = [a + p for a, p in zip(sums, part)]
    return tuple(v & MASK32 for v in sums)


def _fmt(t: torch.Tensor, sums=None) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    shape = "x".join(map(str, t.shape)) or "scalar"
    if sums is None:
        return f"meta:{dtype}:{shape}"
    return f"fx:{dtype}:{shape}:" + "".join(f"{v:08x}" for v in sums)


def state_digest(t: torch.Tensor) -> str:
    """Digest string of one tensor, the same string whether t lives on the CPU (pure torch) or on a CUDA device
    (Triton kernel); the exact definition is in the module docstring."""
    return state_digests({"t": t})["t"]


FALLBACK: list = []        # why this process computes CUDA digests with torch ops instead of the Triton kernel


def state_digests(tensors: dict) -> dict:
    """{name: digest string}.  CUDA tensors go through the Triton kernel, all tensors of a device before one host
    copy; CPU tensors (and CUDA ones where Triton is missing) through `lane_sums`."""
    out, on_device = {}, {}
    for name, t in tensors.items():
        if t.is_meta:
            out[name] = _fmt(t)
        elif t.is_cuda:
            on_device.setdefault(t.device, {})[name] = t
        else:
            out[name] = _fmt(t, lane_sums(t))
    for group in on_device.values():
        sums = None
        if not FALLBACK:
            try:
                from . import digest_triton
                sums = digest_triton.lane_sums_batched(list(group.values()))
            except ImportError:
                FALLBACK.append("triton not importable")
            except Exception as e:  # noqa: BLE001 - a kernel that cannot run here must not stop a check:
                FALLBACK.append(f"{e.__class__.__name__}: {str(e)[:200]}")   # same digests, slower path
        if sums is None:
            sums = [lane_sums(t) for t in group.values()]
        out.update({name: _fmt(t, s) for (name, t), s in zip(group.items(), sums)})
    return {name: out[name] for name in tensors}
