"""Streaming state digest (placeholder implementation of the spec; the fast CPU/Triton one replaces it).

Bytes in C order, zero-padded to a multiple of 4, as little-endian uint32 words w_i. Four lanes j with keys
K = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F); m_ij = fmix32(lo32(i) ^ K_j ^ fmix32(hi32(i) ^ K_j)) * 2 + 1
(mod 2^32); S_j = sum_i w_i * m_ij mod 2^32. Digest: f"fx:{dtype}:{shape}:{S_0:08x}{S_1:08x}{S_2:08x}{S_3:08x}".
"""
from __future__ import annotations

import torch

from .formats.bytes import as_bytes

KEYS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)
M32 = 0xFFFFFFFF


def _fmix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _head(t):
    shape = "x".join(str(s) for s in t.shape) or "scalar"
    return f"{str(t.dtype).removeprefix('torch.')}:{shape}"


def state_digest(t: torch.Tensor) -> str:
    if t.is_meta:
        return f"meta:{_head(t)}"
    b = as_bytes(t).cpu()
    pad = (-b.numel()) % 4
    if pad:
        b = torch.cat([b, torch.zeros(pad, dtype=torch.uint8)])
    w = b.view(torch.int32).to(torch.int64) & M32
    sums = [0, 0, 0, 0]
    chunk = 1 << 20
    for start in range(0, w.numel(), chunk):
        ww = w[start:start + chunk]
        i = torch.arange(start, start + ww.numel(), dtype=torch.int64)
        lo, hi = i & M32, i >> 32
        for j, k in enumerate(KEYS):
            m = (_fmix32(lo ^ k ^ _fmix32(hi ^ k)) * 2 + 1) & M32
            sums[j] = (sums[j] + int(((ww * m) & M32).sum())) & M32
    return f"fx:{_head(t)}:" + "".join(f"{s:08x}" for s in sums)


def state_digests(tensors: dict) -> dict:
    return {n: state_digest(t) for n, t in tensors.items()}
