"""Device-side digests: compare large tensors where they live and move only mismatches.

A digest is two 64-bit polynomial sums over the tensor's 32-bit words with fixed pseudo-random odd multipliers
(integer arithmetic wraps mod 2^64), plus dtype and shape. Equal bits -> equal digests; a random difference
collides with probability ~2^-128. Runs on CUDA or CPU alike.
"""
from __future__ import annotations

import torch

from ..formats.bytes import as_bytes

SEEDS = (0x9E3779B97F4A7C15 & 0x7FFFFFFF, 0xC2B2AE3D27D4EB4F & 0x7FFFFFFF)
_MULT: dict = {}


def _multipliers(n: int, seed: int, device) -> torch.Tensor:
    key = (n, seed, str(device))
    m = _MULT.get(key)
    if m is None:
        g = torch.Generator().manual_seed(seed)
        m = (torch.randint(0, 2 ** 62, (n,), generator=g, dtype=torch.int64) * 2 + 1).to(device)
        _MULT[key] = m
    return m


def device_digest(t: torch.Tensor, seeds=SEEDS) -> tuple:
    if t.is_meta:
        return ("meta", str(t.dtype).removeprefix("torch."), tuple(t.shape))
    b = as_bytes(t)
    pad = (-b.numel()) % 4
    if pad:
        b = torch.cat([b, torch.zeros(pad, dtype=torch.uint8, device=b.device)])
    words = b.view(torch.int32).to(torch.int64)
    out = [str(t.dtype).removeprefix("torch."), tuple(t.shape)]
    for s in seeds:
        out.append(int((words * _multipliers(words.numel(), s, words.device)).sum()))
    return tuple(out)
