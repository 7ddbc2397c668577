"""Alignment rules, as pure functions used identically by collation, preprocessing, replay and the A checks."""
from __future__ import annotations

from math import lcm

from .formats import Recipe
from .kinds import Granularity


def fp8_gemm_multiple(recipe: Recipe | None) -> int:
    """FP8 GEMM dims must be multiples of 16 (TE / cuBLASLt FP8), 32 for MXFP8 (1x32 blocks in both directions)."""
    if recipe is None:
        return 1
    return 32 if recipe.granularity is Granularity.MXFP8 else 16


def packed_pad_multiple(tp: int, cp: int, recipe: Recipe | None) -> int:
    """Token count a packed batch is padded to. FP8 (SkyRL's rule, skyrl/train/utils/packing_utils.py):
    MXFP8 32*TP*CP; blockwise 128*TP*CP when TP > 1 (each sequence-parallel shard must hold whole 128-row
    activation blocks), else 16*CP. Without FP8: a multiple of TP (sequence parallel). Load-balanced context
    parallel cuts each sequence into 2*CP chunks, so the result is also a multiple of 2*CP."""
    if recipe is None:
        m = tp
    elif recipe.granularity is Granularity.MXFP8:
        m = 32 * tp * cp
    else:
        m = (128 * tp if tp > 1 else 16) * cp
    return lcm(m, 2 * cp) if cp > 1 else m


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
