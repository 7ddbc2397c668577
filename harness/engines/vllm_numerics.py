"""vLLM 0.26's own FP8 arithmetic, op for op in PyTorch (the CPU reference rollout and the checks share it;
GPU conformance proves it against the real engine):

* `requant_ue8m0`: `requant_weight_ue8m0_inplace` + `per_block_cast_to_fp8(use_ue8m0=True)`
  (model_executor/layers/quantization/utils/fp8_utils.py, utils/deep_gemm.py): dequantize with the loaded
  scales, per 128x128 block amax clamped to 1e-4, sf = 2^ceil(log2(amax / 448)), q = e4m3(x * (1 / sf)).
* `post_load_requant`: which parameters that applies to on sm90 -- block-FP8 linears the DeepGEMM kernel takes
  (N % 64 == 0, K % 128 == 0) when DeepGEMM and its E8M0 mode are on; routed experts only when the MoE backend
  is DeepGEMM (the sm90 default, Triton, keeps weights as loaded).
* `vllm_online_quant`: the engine quantizing BF16 on its own (naive sync): s = max(amax, 1e-10) / 448.
"""
from __future__ import annotations

import torch

from ..formats import quantize_mxfp8
from ..formats.blockwise import _pad_blocks, dequantize_blockwise
from ..formats.cast import cast_to_fp8


def requant_ue8m0(codes: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)):
    if codes.dim() > 2:
        parts = [requant_ue8m0(c, s, block) for c, s in zip(codes, scale_inv)]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    n, k = codes.shape
    w = dequantize_blockwise(codes, scale_inv, block)
    xv = _pad_blocks(w, block)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    sf = torch.pow(2.0, torch.ceil(torch.log2(sf.abs())))
    q = (xv * (1.0 / sf)).to(codes.dtype)
    q = q.reshape(xv.shape[0] * xv.shape[1], xv.shape[2] * xv.shape[3])[:n, :k].contiguous()
    return q, sf.reshape(xv.shape[0], xv.shape[2]).contiguous()


def is_expert_param(name: str) -> bool:
    return name.endswith(("w13_weight", "w2_weight"))


def requant_applies(config, param_name: str, shape) -> bool:
    """Does the engine's post-load step rewrite this FP8 parameter (vLLM name, engine-local shape)?"""
    if not config.requant_ue8m0:
        return False
    if is_expert_param(param_name):
        return config.rollout.moe_backend == "deep_gemm"
    return shape[-2] % 64 == 0 and shape[-1] % 128 == 0


def post_load_requant(config, param_name: str, codes: torch.Tensor, scale_inv: torch.Tensor):
    """The engine's declared post-load transform of one FP8 parameter (identity unless requant applies)."""
    if config.recipe.granularity != "block" or not requant_applies(config, param_name, codes.shape):
        return codes, scale_inv
    q, s = requant_ue8m0(codes, scale_inv.float(), config.recipe.block_shape)
    return q, s.to(scale_inv.dtype)


def vllm_online_quant(w: torch.Tensor, recipe):
    """The engine quantizing a BF16 weight on its own (naive sync; verl's in-worker quantizer and SkyRL's
    sender use this formula): s = max(amax, 1e-10) / 448, q = e4m3(x / s). MXFP8 uses the OCP rule."""
    if recipe.granularity == "mxfp8":
        return quantize_mxfp8(w, recipe.fp8_dtype)
    if w.dim() > 2:
        parts = [vllm_online_quant(x, recipe) for x in w]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    n, k = w.shape
    xv = _pad_blocks(w.float(), recipe.block_shape)
    s = xv.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-10) / 448.0
    q = cast_to_fp8(xv / s, recipe.fp8_dtype)
    return (q.reshape(xv.shape[0] * xv.shape[1], -1)[:n, :k].contiguous(),
            s.reshape(xv.shape[0], xv.shape[2]).contiguous())
