"""amax -> scale, the one rule Transformer Engine's quantizers share (TE common/recipe/recipe_common.cuh,
`compute_scale_from_amax`), as pure tensor functions.

Every step is an IEEE fp32 operation with one rounding; the PyTorch spelling matters:
`448.0 / amax` with a tensor amax runs `amax.reciprocal() * 448` (two roundings) and misses TE by an ulp,
so the division is written `torch.full_like(amax, 448.0) / amax`.  Inductor undoes that spelling (it turns the
division into a reciprocal-multiply), so `scale_from_amax` is marked `eager_only`: a compiled caller
graph-breaks around it and the eager ops run.
"""
import functools
import sys

import torch

from .constants import INPUT_DTYPE_MAX

POW2_MASK = -8388608  # 0xFF800000 as int32: keep sign and exponent bits


def block_amax(xb: torch.Tensor, dims) -> torch.Tensor:
    """max |x| over `dims`, NaN elements skipped (fmaxf semantics), in fp32."""
    a = xb.float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.amax(dim=dims)


def eager_only(fn):
    """The TE-exact reference never runs compiled: inductor rewrites `448 / amax` into a reciprocal-multiply, one
    ulp off Transformer Engine. `torch.compiler.disable`, applied at the first call rather than at import: the
    decorator imports torch._dynamo (about 2 s), which processes that never quantize (pre-flight, the CLI's
    help) should not pay for. Until something imports torch._dynamo nothing can be compiling (torch.compile and
    torch.export import it), so until then the call runs eagerly and imports nothing: a fault-matrix worker that
    only quantizes eagerly saves that import."""
    disabled = []

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if not disabled:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)
    guarded._fp8check_eager_only = True
    return guarded


@eager_only
def scale_from_amax(amax: torch.Tensor, fp8_max: float, *, pow2: bool = False, amax_epsilon: float = 0.0,
                    input_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """TE's `compute_scale_from_amax`: returns the quantization scale (x * scale -> fp8), fp32."""
    amax = amax.float()
    if amax_epsilon > 0.0:
        amax = torch.maximum(amax, torch.full_like(amax, amax_epsilon))
    scale = torch.full_like(amax, fp8_max) / amax          # one correctly rounded division
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, INPUT_DTYPE_MAX[input_dtype]), scale)
    # amax 0 (without epsilon), inf or NaN: scale 1
    degenerate = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
    scale = torch.where(degenerate, torch.ones_like(scale), scale)
    if pow2:
        scale = (scale.view(torch.int32) & POW2_MASK).view(torch.float32)
    return scale


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """scale_inv = 1 / scale, one correctly rounded fp32 division."""
    return torch.ones_like(scale) / scale


def is_pow2(t: torch.Tensor) -> torch.Tensor:
    """True where a positive fp32 value is an exact power of two (mantissa bits zero)."""
    bits = t.float().view(torch.int32)
    return (bits & 0x7FFFFF == 0) & (t > 0) & torch.isfinite(t)
