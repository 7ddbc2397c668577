"""Alignment rules, as pure functions used identically by collation, preprocessing, replay and the A checks."""
from __future__ import annotations

from math import lcm

from .formats import Recipe


def fp8_gemm_multiple(recipe: Recipe | None) -> int:
    """FP8 GEMM dims must be multiples of 16 (TE / cuBLASLt FP8), 32 for MXFP8 (1x32 blocks in both directions)."""
    if recipe is None:
        return 1
    return 32 if recipe.granularity == "mxfp8" else 16


def packed_pad_multiple(tp: int, cp: int, recipe: Recipe | None) -> int:
    """Token count a packed batch is padded to: a multiple of TP (sequence parallel splits tokens over TP
    ranks), of 2*CP when CP > 1 (load-balanced context parallel cuts each sequence into 2*CP chunks), and of
    the FP8 GEMM multiple when activations are FP8."""
    m = tp * (2 * cp if cp > 1 else 1)
    return lcm(m, fp8_gemm_multiple(recipe))


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
