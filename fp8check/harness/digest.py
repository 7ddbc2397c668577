"""Streaming state digests: one short string per tensor, identical on CPU (pure torch) and CUDA (Triton kernel).

Definition (every implementation here and the pure-Python oracle in tests/test_digest.py follow it exactly):

* bytes: the tensor's bytes in C order (`harness.formats.bytes.as_bytes`), zero-padded to a multiple of 4, read as
  little-endian uint32 words w_0 .. w_{n-1};
* fmix32 = MurmurHash3's finalizer: h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16
  (mod 2^32, logical shifts);
* blocks of B = 4096 words: word i sits at t = i mod B of block k = i div B;
* four lanes j = 0..3, keys K = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F); lane j's multiplier of word i is
  m_ij = P_j[t] * Q_j[k] (mod 2^32, odd), with P_j[t] = fmix32(t ^ K_j) * 2 + 1 and
  Q_j[k] = fmix32(lo32(k) ^ K_j ^ fmix32(hi32(k) ^ K_j)) * 2 + 1 (`harness.digest_words`);
* lane sum S_j = sum_i fmix32(w_i) * m_ij = sum_k Q_j[k] * (sum_t fmix32(w_{kB+t}) * P_j[t]) mod 2^32;
* string f"fx:{dtype}:{'x'.join(shape) or 'scalar'}:{S_0:08x}{S_1:08x}{S_2:08x}{S_3:08x}" (dtype without
  "torch."); a meta tensor gives f"meta:{dtype}:{shape}" with the same shape spelling.

Why fmix32(w_i) and not w_i: with w_i itself, bit 31 of a word reaches only bit 31 of each lane sum (2^31 * m =
2^31 mod 2^32 for every odd m), so flipping bit 31 in any two words (the signs of two fp32 values) left all four
lanes unchanged. fmix32 is a bijection, so a changed word still always changes every lane (m is odd), and its
avalanche turns structured differences into pseudo-random ones. fmix32(0) = 0 keeps the zero padding neutral.

Why the multiplier factors through blocks: a multiplier hashed from each word's position i costs the GPU kernel
a hash per word, which makes it ALU-bound; with P read from a 64 KiB table that stays in the cache and Q applied
once to a block's sum, the per-word arithmetic is a few operations and the kernel is bound by memory, as a digest
that reads every byte should be. Position still matters at both scales: two words swapped
inside a block change a lane unless (f_a - f_b)(P_j[t] - P_j[t']) = 0 mod 2^32, two blocks swapped unless
(Q_j[k] - Q_j[k'])(block sums' difference) = 0.

The sums are additive over words, so a tensor can be cut anywhere (chunks, programs, pieces of a fused parameter
at their word offsets) and the parts added: `assembled_digests` digests a tensor that is only described (the
pieces a layout map would copy into it) without building it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .digest_words import BLOCK_WORDS, KEYS, MASK32, block_table, fmix32_int, in_block, of_block  # noqa: F401
from .formats.bytes import any_sentinel, as_bytes

CHUNK_WORDS = 1 << 20          # CPU: words per pass (a multiple of BLOCK_WORDS): a few MiB whatever the tensor size


def _s32(v: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits."""
    v &= MASK32
    return v - (1 << 32) if v >= 1 << 31 else v


_C1, _C2 = _s32(0x85EBCA6B), _s32(0xC2B2AE35)
def _fmix32_(h: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """fmix32 in place on an int32 tensor (int32 multiply wraps mod 2^32; `>>` is arithmetic, so mask)."""
    for shift, mask, mult in ((16, 0xFFFF, _C1), (13, 0x7FFFF, _C2), (16, 0xFFFF, None)):
        torch.bitwise_right_shift(h, shift, out=tmp)
        tmp.bitwise_and_(mask)
        h.bitwise_xor_(tmp)
        if mult is not None:
            h.mul_(mult)
    return h


@functools.lru_cache(maxsize=64)
def _block_multipliers(k0: int, nb: int) -> torch.Tensor:
    """Q_j[k] for k in [k0, k0 + nb), int64 [4, nb] (host; the first chunks' are kept: most tensors are small)."""
    return torch.tensor([[of_block(k, j) for k in range(k0, k0 + nb)] for j in range(4)], dtype=torch.int64)


def lane_sums(t: torch.Tensor, base_word: int = 0) -> tuple[int, int, int, int]:
    """(S_0, S_1, S_2, S_3) with torch ops only (any device; the CPU path). `base_word` (a multiple of
    BLOCK_WORDS) offsets the word indices: the tensor's part of a larger one starting there."""
    if base_word % BLOCK_WORDS:
        raise ValueError(f"base_word {base_word} is not a multiple of {BLOCK_WORDS}")
    b = as_bytes(t)
    nbytes = b.numel()
    sums = [0, 0, 0, 0]
    if nbytes == 0:
        return tuple(sums)
    size = min(CHUNK_WORDS, -(-nbytes // 4))
    words = torch.empty(size, dtype=torch.int32, device=b.device)     # per call: no buffer shared across threads
    tmp = torch.empty(size, dtype=torch.int32, device=b.device)
    p = block_table(b.device)
    step = 4 * CHUNK_WORDS
    for s in range(0, nbytes, step):
        seg = b[s:s + step]
        nb_ = seg.numel()
        n = -(-nb_ // 4)
        w = words[:n]
        if nb_ % 4 == 0 and seg.storage_offset() % 4 == 0:
            w.copy_(seg.view(torch.int32))               # the caller's tensor is never modified
        else:                                            # unaligned bytes or a zero-padded last word
            w[-1] = 0
            w.view(torch.uint8)[:nb_].copy_(seg)
        _fmix32_(w, tmp[:n])
        # per lane, each block's sum (the last block's words meet the first positions of P): an int32
        # matrix-vector product wraps mod 2^32
        full, rest = divmod(n, BLOCK_WORDS)
        cols = [torch.mv(w[:full * BLOCK_WORDS].view(full, BLOCK_WORDS), p[j]) for j in range(4)] if full else None
        if rest:
            tail = torch.mv(p[:, :rest], w[full * BLOCK_WORDS:])
            blocks = torch.cat([torch.stack(cols), tail[:, None]], dim=1) if full else tail[:, None]
        else:
            blocks = torch.stack(cols)
        q = _block_multipliers(base_word // BLOCK_WORDS + s // (4 * BLOCK_WORDS), blocks.shape[1])
        # int64 products wrap mod 2^64, whose low 32 bits are the product mod 2^32
        part = ((blocks.cpu().to(torch.int64) & MASK32) * q).sum(dim=1).tolist()
        sums = [a + v for a, v in zip(sums, part)]
    return tuple(v & MASK32 for v in sums)


def _fmt(dtype, shape, sums=None) -> str:
    dtype = str(dtype).removeprefix("torch.")
    shape = "x".join(map(str, shape)) or "scalar"
    if sums is None:
        return f"meta:{dtype}:{shape}"
    return f"fx:{dtype}:{shape}:" + "".join(f"{v:08x}" for v in sums)


def state_digest(t: torch.Tensor) -> str:
    """Digest string of one tensor, the same string whether t lives on the CPU (pure torch) or on a CUDA device
    (Triton kernel); the exact definition is in the module docstring."""
    return state_digests({"t": t})["t"]


FALLBACK: list = []        # why this process computes CUDA digests with torch ops instead of the Triton kernel


def _device_sums(groups: list, sentinel_sizes: list | None):
    """Lane sums (and sentinel flags) of `groups` (each a list of (tensor, first word)) on one CUDA device through
    the Triton kernel, or None where it cannot run here (FALLBACK says why)."""
    started = _start_device_sums(groups, sentinel_sizes)
    return started() if started is not None else None


def _start_device_sums(groups: list, sentinel_sizes: list | None):
    """`_device_sums` with the kernels enqueued now: a function giving the result (one host copy), or None."""
    if FALLBACK:
        return None
    try:
        from . import digest_triton
        return digest_triton.start_lane_sums_pieces(groups, sentinel_sizes)
    except ImportError:
        FALLBACK.append("triton not importable")
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run here must not stop a check:
        FALLBACK.append(f"{e.__class__.__name__}: {str(e)[:200]}")   # same digests, slower path
    return None


def state_digests(tensors: dict) -> dict:
    """{name: digest string}.  CUDA tensors go through the Triton kernel, all tensors of a device before one host
    copy; CPU tensors (and CUDA ones where Triton is missing) through `lane_sums`."""
    return start_state_digests(tensors)()


def start_state_digests(tensors: dict):
    """`state_digests` started: the device's kernels enqueued now, the host copy (and the CPU tensors' digests)
    when the returned function is called, so that host work in between overlaps the device's."""
    out, on_device = {}, {}
    for name, t in tensors.items():
        if t.is_meta:
            out[name] = _fmt(t.dtype, t.shape)
        elif t.is_cuda:
            on_device.setdefault(t.device, {})[name] = t
    started = [(group, _start_device_sums([[(t, 0)] for t in group.values()], None))
               for group in on_device.values()]

    def finish() -> dict:
        for name, t in tensors.items():
            if name not in out and not t.is_cuda:
                out[name] = _fmt(t.dtype, t.shape, lane_sums(t))
        for group, got in started:
            sums = got()[0] if got is not None else [lane_sums(t) for t in group.values()]
            out.update({name: _fmt(t.dtype, t.shape, s) for (name, t), s in zip(group.items(), sums)})
        return {name: out[name] for name in tensors}
    return finish


@dataclass(frozen=True)
class Assembled:
    """A tensor described, not held: `shape` and `dtype`, zero except where `pieces` put their bytes, each a
    (tensor, byte offset) whose C-order bytes land at that offset (a fused parameter a layout map would build
    from checkpoint tensors; the pieces do not overlap)."""
    shape: tuple
    dtype: torch.dtype
    device: torch.device
    pieces: tuple

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    def materialize(self) -> torch.Tensor:
        if len(self.pieces) == 1:
            t, off = self.pieces[0]
            if off == 0 and tuple(t.shape) == tuple(self.shape) and t.dtype == self.dtype and t.device == self.device:
                return t                        # the whole tensor is that piece (a caller never writes it)
        out = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        flat = as_bytes(out)
        for t, off in self.pieces:
            b = as_bytes(t)
            flat[off:off + b.numel()].copy_(b.to(flat.device))
        return out

    def word_pieces(self) -> list | None:
        """[(tensor, first word)] where every piece starts on a word of the assembled tensor and no two share one
        (each ends on a word boundary or at the end): the kernel's pieces. None where that does not hold."""
        end, out = self.nbytes, []
        for t, off in self.pieces:
            n = t.numel() * t.element_size()
            if off % 4 or (n % 4 and off + n != end) or off + n > end:
                return None
            out.append((t, off // 4))
        return out


# bytes of assembled tensors made at once where they must be built (CPU, unaligned pieces): a bounded temporary
MATERIALIZE_BYTES = 256 << 20


def assembled_digests(targets: dict, sentinels: bool = False) -> dict:
    """{name: (digest string, sentinel flag)} of `Assembled` targets: the digest the built tensor would have, and
    (with `sentinels`) whether some element of it is all poison bytes (None without). On CUDA the pieces are
    digested where they lie, at their word offsets, in one batch; elsewhere each target is built (a bounded
    number of bytes at a time) and digested as a tensor."""
    out: dict = {}
    direct, built = {}, []
    for name, a in targets.items():
        pieces = a.word_pieces() if a.device.type == "cuda" else None
        es = a.dtype.itemsize
        if pieces is not None and (not sentinels or es in (1, 2, 4)):
            direct[name] = (a, pieces, es)
        else:
            built.append(name)
    if direct:
        got = _device_sums([p for _, p, _ in direct.values()], [es for _, _, es in direct.values()]
                           if sentinels else None)
        if got is None:
            built += list(direct)
        else:
            for (name, (a, _, _)), s, hit in zip(direct.items(), *got):
                out[name] = (_fmt(a.dtype, a.shape, s), bool(hit) if sentinels else None)
    batch, size = {}, 0
    for i, name in enumerate(built):
        a = targets[name]
        batch[name] = a.materialize()
        size += a.nbytes
        if size >= MATERIALIZE_BYTES or i == len(built) - 1:
            ds = state_digests(batch)
            for n, t in batch.items():
                out[n] = (ds[n], any_sentinel(t) if sentinels else None)
            batch, size = {}, 0
    return {name: out[name] for name in targets}
