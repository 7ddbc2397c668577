"""How each recipe's scale tensors are named and typed on the wire, as the RL stacks send them and vLLM 0.26
loads them: the one naming map. fp8check's own name for every recipe is `<weight>_scale_inv` in the recipe's scale
dtype (its snapshots, layouts and checks speak only that); a wire name the map lists for the recipe is read as it,
byte for byte (`canonical_scale`); any other stack's name for a scale is a wrong name, and `misnamed_scale` says
which name the recipe's wire expects.

vLLM 0.26 loads, per recipe:
* blockwise (`Fp8Config` with `weight_block_size`, a block-FP8 checkpoint): `<linear>.weight_scale_inv`, float32
  [ceil(N/128), ceil(K/128)] (model_executor/layers/quantization/fp8.py: "The weight_scale_inv name is
  intentional for deepseekv3"); routed experts `w13_weight_scale_inv` / `w2_weight_scale_inv`.
* MXFP8 (compressed-tensors, `_is_mxfp8`: group 32, float 8-bit, `scale_dtype` uint8): `<linear>.weight_scale`,
  uint8 E8M0 exponents [N, K/32] (compressed_tensors/schemes/compressed_tensors_w8a8_mxfp8.py, `create_weights`;
  utils/mxfp8_utils.py `MXFP8_SCALE_DTYPE = torch.uint8`); routed experts `w13_weight_scale` / `w2_weight_scale`,
  uint8 (compressed_tensors_moe/compressed_tensors_moe_w8a8_mxfp8.py). SkyRL 0.4.0's mxfp8 wire sends exactly
  that (weight_sync/fp8/models/base.py `WIRE_SCALE_SUFFIX`, quantize.py `mx_cast_to_fp8`). Transformer Engine
  holds the same bytes as float8_e8m0fnu (`MXFP8Tensor._rowwise_scale_inv`), fp8check's own name for them.
"""
from __future__ import annotations

from dataclasses import dataclass

CANONICAL = "_scale_inv"


@dataclass(frozen=True)
class WireScale:
    suffix: str           # after the weight's name (`x.weight` + `_scale_inv`)
    dtype: str            # torch dtype name of the tensor as sent
    who: str              # who names them so


# recipe granularity -> the scale namings its wire accepts, fp8check's own first; the one source
WIRE_SCALES: dict[str, tuple[WireScale, ...]] = {
    "block": (WireScale(CANONICAL, "float32", "vLLM 0.26 block-FP8 checkpoints, Transformer Engine, fp8check"),),
    "mxfp8": (WireScale(CANONICAL, "float8_e8m0fnu", "Transformer Engine (MXFP8Tensor), fp8check"),
              WireScale("_scale", "uint8", "vLLM 0.26 compressed-tensors MXFP8, SkyRL 0.4.0's mxfp8 wire")),
    "tensor": (WireScale(CANONICAL, "float32", "fp8check (vLLM's per-tensor FP8 holds one weight_scale per "
                                               "fused parameter)"),),
}
# every scale suffix some stack uses, longest first (`_scale_inv` before `_scale`)
ALL_SUFFIXES = tuple(sorted({w.suffix for ws in WIRE_SCALES.values() for w in ws}, key=len, reverse=True))


def _split(name: str) -> tuple[str, str] | None:
    """(weight name, scale suffix) of a name that is some stack's scale of a `.weight` / expert weight."""
    for suffix in ALL_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)].endswith("weight"):
            return name[: -len(suffix)], suffix
    return None


def canonical_scale(name: str, tensor, granularity: str):
    """(fp8check's name, the tensor in the recipe's scale dtype) for a scale the recipe's wire names this way (a
    uint8 MXFP8 `weight_scale` is viewed as float8_e8m0fnu: the same bytes); None for any other name or dtype."""
    parts = _split(name)
    if parts is None:
        return None
    weight, suffix = parts
    dtype = str(tensor.dtype).removeprefix("torch.")
    accepted = WIRE_SCALES.get(granularity, ())
    for w in accepted:
        if w.suffix == suffix and w.dtype == dtype:
            if suffix == CANONICAL:
                return name, tensor
            want = accepted[0].dtype
            import torch
            return weight + CANONICAL, tensor.view(getattr(torch, want))
    return None


def misnamed_scale(name: str, granularity: str) -> tuple[str, str, str] | None:
    """For a name that is another stack's naming of a weight's scale the recipe's wire does not use: (the weight,
    the name vLLM 0.26 loads this recipe's scale under, its dtype); None otherwise."""
    parts = _split(name)
    if parts is None:
        return None
    weight, suffix = parts
    accepted = WIRE_SCALES.get(granularity, ())
    if any(w.suffix == suffix for w in accepted):
        return None
    want = accepted[-1] if accepted else WireScale(CANONICAL, "float32", "")
    return weight, weight + want.suffix, want.dtype


def expected_names(granularity: str) -> str:
    """The namings a recipe's wire accepts, in words (`x.weight_scale_inv` float32, ...)."""
    return " or ".join(f"<weight>{w.suffix} ({w.dtype}: {w.who})" for w in WIRE_SCALES.get(granularity, ()))


__all__ = ["ALL_SUFFIXES", "CANONICAL", "WIRE_SCALES", "WireScale", "canonical_scale", "expected_names",
           "misnamed_scale"]
