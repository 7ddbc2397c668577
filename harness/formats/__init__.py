"""FP8 formats, bit-exact to Transformer Engine's quantizers (docs/design.md, "Numerics to mirror exactly")."""
from .blockwise import dequantize_blockwise, expand_scale, grid_shape, quantize_blockwise
from .cast import cast_to_fp8
from .constants import (ACT_BLOCK, E4M3, E4M3_MAX, E5M2, E5M2_MAX, E8M0, FP8_MAX, MX_BLOCK, WEIGHT_BLOCK)
from .mxfp8 import dequantize_mxfp8, e8m0_to_float, float_to_e8m0, quantize_mxfp8
from .per_tensor import dequantize_per_tensor, quantize_per_tensor
from .recipe import NATIVE_ARCH, RECIPES, Recipe, RecipeError, arch_major, get_recipe, recipe_for_arch
from .scaling import block_amax, is_pow2, reciprocal, scale_from_amax
from .te_layout import te_to_wire, wire_to_te

__all__ = [
    "ACT_BLOCK", "E4M3", "E4M3_MAX", "E5M2", "E5M2_MAX", "E8M0", "FP8_MAX", "MX_BLOCK", "WEIGHT_BLOCK",
    "NATIVE_ARCH", "RECIPES", "Recipe", "RecipeError", "arch_major", "get_recipe", "recipe_for_arch",
    "block_amax", "cast_to_fp8", "dequantize_blockwise", "dequantize_mxfp8", "dequantize_per_tensor",
    "e8m0_to_float", "expand_scale", "float_to_e8m0", "grid_shape", "is_pow2", "quantize_blockwise",
    "quantize_mxfp8", "quantize_per_tensor", "reciprocal", "scale_from_amax", "te_to_wire", "wire_to_te",
    "quantize_blockwise_triton",
]


def __getattr__(name):
    # lazy: importing harness.formats must not import Triton (slow, and absent on CPU-only machines)
    if name == "quantize_blockwise_triton":
        from .triton_blockwise import quantize_blockwise_triton
        return quantize_blockwise_triton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
