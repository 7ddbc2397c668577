"""Post-load transforms an engine may declare (EngineRecord.post_load): what the engine's
`process_weights_after_loading` does to an FP8 parameter's codes and scales after they are loaded.

* `identity`: kernels read the loaded bytes (vLLM 0.26 on sm90 with CUTLASS or DeepGEMM with FP32 scales).
* `ue8m0_requant`: vLLM 0.26's `requant_weight_ue8m0_inplace` + `per_block_cast_to_fp8(use_ue8m0=True)`
  (model_executor/layers/quantization/utils/fp8_utils.py, utils/deep_gemm.py), op for op: dequantize with the
  loaded scales, per 128x128 block amax clamped to 1e-4, sf = 2^ceil(log2(amax / 448)), q = e4m3(x * (1 / sf)).
  Proven bit for bit against the real engine on the H200 (tests/gpu/test_vllm_conformance.py).
Both are block-local, so applying them per checkpoint tensor equals applying them per fused engine parameter.
"""
from __future__ import annotations

import torch

from ..formats.blockwise import dequantize_blockwise, pad_blocks


def identity(codes: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)):
    return codes, scale_inv


def requant_ue8m0(codes: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)):
    if codes.dim() > 2:
        parts = [requant_ue8m0(c, s, block) for c, s in zip(codes, scale_inv)]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    n, k = codes.shape
    w = dequantize_blockwise(codes, scale_inv.float(), block)
    xv = pad_blocks(w, block)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    sf = torch.pow(2.0, torch.ceil(torch.log2(sf.abs())))
    q = (xv * (1.0 / sf)).to(codes.dtype)
    q = q.reshape(xv.shape[0] * xv.shape[1], xv.shape[2] * xv.shape[3])[:n, :k].contiguous()
    return q, sf.reshape(xv.shape[0], xv.shape[2]).contiguous().to(scale_inv.dtype)


TRANSFORMS = {"identity": identity, "ue8m0_requant": requant_ue8m0}


def apply_post_load(post_load, param: str, codes: torch.Tensor, scale_inv: torch.Tensor):
    """The declared transform applied to one FP8 parameter (rank-named, as the record lists it):
    (codes, scale_inv, transformed?)."""
    if post_load is None or post_load.kind == "identity" or param not in post_load.params:
        return codes, scale_inv, False
    q, s = TRANSFORMS[post_load.kind](codes, scale_inv, tuple(post_load.block_shape))
    return q, s, True
