"""vLLM 0.26's own FP8 rules, as the engine adapters (the CPU reference rollout and the vLLM adapter) declare
and mirror them; the arithmetic of the transforms lives in harness.numerics (the checks apply what an engine
declares and never import this module). GPU conformance proves both against the real engine.

* `requant_applies`: which FP8 parameters vLLM's post-load step requantizes to UE8M0 on sm90 -- block-FP8
  linears the DeepGEMM kernel takes (N % 64 == 0, K % 128 == 0) when DeepGEMM and its E8M0 mode are on; routed
  experts only when the MoE backend is DeepGEMM (the sm90 default, Triton, keeps weights as loaded).
* `declared_post_load`: that rule as the engine's declaration (EngineRecord.post_load).
* `declared_act_quant`: how the engine's FP8 GEMMs quantize activations (per-token groups of 128 with
  s = max(amax, 1e-10) / 448, UE8M0-rounded on the DeepGEMM E8M0 path; MXFP8 on Blackwell).

The online rules (an engine quantizing the BF16 it is handed) are harness.numerics.online's `online_quantize`.
"""
from __future__ import annotations

from ..kinds import Granularity
from ..layouts import rank_name
from ..record import PostLoad


def is_expert_param(name: str) -> bool:
    return name.endswith(("w13_weight", "w2_weight"))


def requant_applies(config, param_name: str, shape, ue8m0: bool | None = None) -> bool:
    """Does the engine's post-load step rewrite this FP8 parameter (vLLM name, engine-local shape)? `ue8m0`:
    whether the engine requantizes at all, as read from the engine (default: as the config resolves it)."""
    if not (config.requant_ue8m0 if ue8m0 is None else ue8m0):
        return False
    if is_expert_param(param_name):
        return config.rollout.moe_backend == "deep_gemm"
    return shape[-2] % 64 == 0 and shape[-1] % 128 == 0


def declared_post_load(config, fp8_params: list[tuple[int, str, tuple]], ue8m0: bool | None = None) -> PostLoad:
    """fp8_params: (rank, vLLM name, engine-local shape) of every FP8 weight the engine holds; `ue8m0`: the
    engine's own UE8M0 requantization setting where it was read from the engine."""
    params = sorted(rank_name(n, r, config.rollout.tp_size) for r, n, shp in fp8_params
                    if config.engine_recipe.granularity is Granularity.BLOCK and requant_applies(config, n, shp, ue8m0))
    return PostLoad("ue8m0_requant" if params else "identity", params, list(config.recipe.block_shape))


def declared_act_quant(config, ue8m0: bool | None = None) -> str:
    if not config.engine_fp8_tensors:
        return "none"
    if config.engine_recipe.granularity is Granularity.TENSOR:
        return "vllm-per-token"          # the per-tensor online method: dynamic per-token activation scales
    if config.recipe.granularity is Granularity.MXFP8:
        return "mxfp8"
    return "vllm-ue8m0" if (config.requant_ue8m0 if ue8m0 is None else ue8m0) else "vllm"
