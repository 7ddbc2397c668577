"""SkyRL 0.4.0's per-model FP8 spec, as data: which exported weights its serialized FP8 sync quantizes, for the
models it has a spec for (Qwen3.5, its one registered spec). A SkyRL job's exclusion set is derived from it
(`skyrl_exclusion`), so pre-flight's X rules judge the exclusion SkyRL really applies -- which keeps GDN
`in_proj_a` / `in_proj_b` in BF16 in vLLM while Megatron-Core quantizes the fused GDN `in_proj` whole (X3, S6).

Source: skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py (SkyRL 0.4.0): `_QWEN35_FP8_WEIGHT_SUFFIXES`
(lines 20-35: the weights serialized as FP8; router and shared-expert gate stay BF16), `is_qwen35_config` (72-77),
`is_quantizable_weight_shape` (138-154: a `.weight` of a 2D shape ending in one of the suffixes; MXFP8 also needs
K % 32 == 0), `_QWEN35_UNQUANTIZED_LINEAR_SUFFIXES` (40-43: in_proj_b, in_proj_a, the engine's ignored_layers).
`examples/skyrl_fp8_sync` holds this table to SkyRL's own functions, loaded from its wheel.
"""
from __future__ import annotations

from .versions import SKYRL_VERSION

SPEC_SOURCE = "skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py"
SPEC_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# the checkpoint-name suffixes SkyRL serializes as FP8 (qwen35.py:20-35)
FP8_WEIGHT_SUFFIXES = (
    ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight", ".self_attn.o_proj.weight",
    ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight",
    ".linear_attn.in_proj_qkv.weight", ".linear_attn.in_proj_z.weight", ".linear_attn.out_proj.weight",
    ".mlp.shared_expert.gate_proj.weight", ".mlp.shared_expert.up_proj.weight", ".mlp.shared_expert.down_proj.weight",
)
# routed experts travel batched (`mlp.experts.gate_up_proj` / `down_proj`, qwen35.py:36-39, 157-168), always FP8
EXPERTS = ".mlp.experts."
MXFP8_GROUP = 32


def has_spec(model_type: str) -> bool:
    return model_type in SPEC_MODEL_TYPES


def quantizes(name: str, shape, wire: str) -> bool:
    """Whether SkyRL's Qwen3.5 spec serializes the exported weight `name` (checkpoint name, per-expert names for
    routed experts) as FP8 on `wire` ("blockwise" or "mxfp8")."""
    if EXPERTS in name:
        return True
    if not name.endswith(FP8_WEIGHT_SUFFIXES) or len(shape) != 2:
        return False
    return not (wire == "mxfp8" and shape[1] % MXFP8_GROUP)


def skyrl_exclusion(spec, wire: str) -> list[str] | None:
    """The GEMM modules SkyRL's spec keeps in high precision for this model (exact module names, in checkpoint
    order), or None when SkyRL has no spec for it."""
    from ..models import LINEAR
    if not has_spec(spec.model_type):
        return None
    out: list[str] = []
    for t in spec.tensors():
        if t.kind == LINEAR and not quantizes(t.name, t.shape, wire) and t.module not in out:
            out.append(t.module)
    return out


__all__ = ["FP8_WEIGHT_SUFFIXES", "SKYRL_VERSION", "SPEC_MODEL_TYPES", "SPEC_SOURCE", "has_spec", "quantizes",
           "skyrl_exclusion"]
