"""FP8 formats, bit-exact to Transformer Engine's quantizers (docs/design.md, "Numerics to mirror exactly").
Names load on first use (`harness.lazy.lazy_exports`): recipes without torch, Triton only when asked for."""
from ..lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    ".blockwise": ("dequantize_blockwise", "expand_scale", "grid_shape", "quantize_blockwise"),
    ".cast": ("cast_to_fp8",),
    ".constants": ("ACT_BLOCK", "E4M3", "E4M3_MAX", "E5M2", "E5M2_MAX", "E8M0", "FP8_MAX", "MX_BLOCK",
                   "WEIGHT_BLOCK"),
    ".mxfp8": ("dequantize_mxfp8", "e8m0_to_float", "float_to_e8m0", "quantize_mxfp8"),
    ".per_tensor": ("dequantize_per_tensor", "quantize_per_tensor"),
    ".recipe": ("NATIVE_ARCH", "RECIPES", "Recipe", "RecipeError", "arch_major", "get_recipe", "recipe_for_arch"),
    ".scaling": ("block_amax", "is_pow2", "reciprocal", "scale_from_amax"),
    ".te_layout": ("te_to_wire", "wire_to_te"),
    ".triton_blockwise": ("quantize_blockwise_triton",),
})
