"""Recipe: what FP8 format a weight sync carries. One frozen dataclass, validated once; named recipes."""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:                       # torch is imported where a tensor is made: pre-flight reads recipes without it
    import torch

from ..errors import RecipeError, did_you_mean  # noqa: F401 - RecipeError raised here, defined with the other input errors
from ..kinds import Granularity, ScaleFormat, member, values
from ..schema import SchemaError, from_data
from .constants import FP8_FORMATS, MX_BLOCK

# the values as plain strings: what error messages and pre-flight's choices list
GRANULARITIES = values(Granularity)
SCALE_FORMATS = values(ScaleFormat)


@dataclass(frozen=True)
class Recipe:
    name: str
    fp8_format: str = "e4m3"
    granularity: Granularity = Granularity.BLOCK      # a string is taken as its member
    scale_format: ScaleFormat = ScaleFormat.FP32
    amax_epsilon: float = 0.0
    block_shape: tuple[int, int] = (128, 128)       # weights
    act_block_shape: tuple[int, int] = (1, 128)     # activations / gradients

    def __post_init__(self):
        if self.fp8_format not in FP8_FORMATS:
            raise RecipeError(f"recipe {self.name!r}: fp8_format must be one of {sorted(FP8_FORMATS)}, got {self.fp8_format!r}")
        g, s = member(Granularity, self.granularity), member(ScaleFormat, self.scale_format)
        if g is None:
            raise RecipeError(f"recipe {self.name!r}: granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if s is None:
            raise RecipeError(f"recipe {self.name!r}: scale_format must be one of {SCALE_FORMATS}, got {self.scale_format!r}")
        object.__setattr__(self, "granularity", g)          # frozen: the one coercion, before anything reads them
        object.__setattr__(self, "scale_format", s)
        if (g is Granularity.MXFP8) != (s is ScaleFormat.E8M0):
            raise RecipeError(f"recipe {self.name!r}: e8m0 scales go with mxfp8 granularity and only with it")
        for what in ("block_shape", "act_block_shape"):
            v = getattr(self, what)
            if not (isinstance(v, tuple) and len(v) == 2 and
                    all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)):
                raise RecipeError(f"recipe {self.name!r}: {what} must be two positive integers, got {v!r}")
        if isinstance(self.amax_epsilon, bool) or not isinstance(self.amax_epsilon, (int, float)):
            raise RecipeError(f"recipe {self.name!r}: amax_epsilon must be a number, got {self.amax_epsilon!r}")
        if self.amax_epsilon < 0:
            raise RecipeError(f"recipe {self.name!r}: amax_epsilon must be >= 0, got {self.amax_epsilon}")
        if g is Granularity.MXFP8:
            object.__setattr__(self, "block_shape", (1, MX_BLOCK))
            object.__setattr__(self, "act_block_shape", (1, MX_BLOCK))

    @classmethod
    def __from_data__(cls, value, where: str) -> "Recipe":
        """The schema's reading of a recipe (harness.schema): a name, or a mapping with a `name` and fields that
        override that recipe's, each checked against its annotation. Raises SchemaError naming `where`."""
        if isinstance(value, cls):
            return value
        try:
            if isinstance(value, str):
                return get_recipe(value)
            if isinstance(value, dict):
                over = dict(value)
                name = over.pop("name", None)
                if name is None:
                    raise SchemaError(f"{where} mapping needs a 'name' (one of {', '.join(RECIPES)})")
                if not isinstance(name, str):
                    raise SchemaError(f"{where}.name must be a recipe name (one of {', '.join(RECIPES)})")
                hints = {f: t for f, t in typing.get_type_hints(cls).items() if f != "name"}
                for k in over:
                    if k not in hints:
                        raise SchemaError(f"{where}: unknown key {k!r}{did_you_mean(k, hints)}; expected keys: name, "
                                          f"{', '.join(sorted(hints))}")
                return get_recipe(name, **{k: from_data(hints[k], v, f"{where}.{k}") for k, v in over.items()})
        except RecipeError as e:
            raise SchemaError(f"{where}: {e}") from None
        raise SchemaError(f"{where} must be a name or a mapping, got {type(value).__name__}")

    @property
    def fp8_dtype(self) -> torch.dtype:
        from .constants import FP8_DTYPES
        return FP8_DTYPES[self.fp8_format]

    @property
    def scale_dtype(self) -> torch.dtype:
        import torch
        from .constants import E8M0
        return E8M0 if self.scale_format is ScaleFormat.E8M0 else torch.float32

    @property
    def native_arch(self) -> str:
        return NATIVE_ARCH[self.granularity]

    @property
    def pow2(self) -> bool:
        return self.scale_format in (ScaleFormat.POW2, ScaleFormat.E8M0)

    def quantize_weight(self, w: torch.Tensor):
        """The trainer's FP8 forward weight: (codes, scale_inv) in the wire layout."""
        from .mxfp8 import quantize_mxfp8
        from .per_tensor import quantize_per_tensor
        if self.granularity is Granularity.BLOCK:
            return blockwise_quantizer(w)(w, self.block_shape, pow2=self.pow2, amax_epsilon=self.amax_epsilon,
                                          fp8_dtype=self.fp8_dtype)
        if self.granularity is Granularity.MXFP8:
            return quantize_mxfp8(w, self.fp8_dtype, self.block_shape[1])
        return quantize_per_tensor(w, amax_epsilon=self.amax_epsilon, pow2=self.pow2, fp8_dtype=self.fp8_dtype)

    def dequantize_weight(self, codes: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        from .blockwise import dequantize_blockwise
        from .mxfp8 import dequantize_mxfp8
        from .per_tensor import dequantize_per_tensor
        if self.granularity is Granularity.BLOCK:
            return dequantize_blockwise(codes, scale_inv, self.block_shape)
        if self.granularity is Granularity.MXFP8:
            return dequantize_mxfp8(codes, scale_inv, self.block_shape[1])
        return dequantize_per_tensor(codes, scale_inv)

    def scale_grid(self, shape) -> tuple[int, ...]:
        """Wire shape of the scale tensor for a weight of `shape` (leading expert dims kept)."""
        lead = tuple(shape[:-2])
        if self.granularity is Granularity.TENSOR:
            return lead + (1,)              # one scale per tensor (a stack of experts: one per expert)
        bn, bk = self.block_shape
        return lead + (-(-shape[-2] // bn), -(-shape[-1] // bk))


# The GPU architecture each granularity runs on natively (one source: SyncConfig.arch, recommended configs, the
# Hypothesis strategies and pre-flight's `fp8_recipe: auto` all read it): Hopper's blockwise FP8 GEMMs, Blackwell's
# MXFP8 ones. `recipe_for_arch` is the inverse rule RL stacks apply to `auto` (SkyRL: blockwise below sm100).
NATIVE_ARCH = {Granularity.BLOCK: "sm90", Granularity.TENSOR: "sm90", Granularity.MXFP8: "sm100"}


def blockwise_quantizer(x: torch.Tensor):
    """The TE-exact blockwise quantizer for `x`'s device: the torch reference, or on CUDA its Triton twin (the same
    bytes, tests/gpu/test_triton_conformance.py; C1 re-quantizes every master each sync, and P1's 1x128 activation
    blocks take one launch with no host round trip). Same signature either way."""
    from .blockwise import quantize_blockwise
    if x.is_cuda:
        from . import triton_blockwise          # it imports without Triton too
        if triton_blockwise.triton is not None:
            return triton_blockwise.quantize_blockwise_triton
    return quantize_blockwise


def arch_major(arch: str) -> int | None:
    try:
        return int(str(arch).removeprefix("sm")) // 10
    except ValueError:
        return None


def recipe_for_arch(arch: str) -> str:
    """`fp8_recipe: auto`: the granularity name a stack picks on `arch` (mxfp8 on Blackwell, blockwise below)."""
    major = arch_major(arch)
    return "mxfp8" if major is not None and major >= 10 else "blockwise"


RECIPES = {
    "blockwise-fp32": Recipe("blockwise-fp32", scale_format=ScaleFormat.FP32),
    "blockwise-pow2": Recipe("blockwise-pow2", scale_format=ScaleFormat.POW2),
    "mxfp8": Recipe("mxfp8", granularity=Granularity.MXFP8, scale_format=ScaleFormat.E8M0),
}


def get_recipe(name: str, **overrides) -> Recipe:
    if name not in RECIPES:
        raise RecipeError(f"unknown recipe {name!r}{did_you_mean(name, RECIPES)}; choose one of: {', '.join(RECIPES)}")
    if not overrides:
        return RECIPES[name]
    base = RECIPES[name]
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    fields.update(overrides)
    return Recipe(**fields)
