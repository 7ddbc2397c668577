"""Engine-side (online) FP8 quantization of BF16 weights: the rules an engine applies when it is handed BF16 and
quantizes itself, written once for every caller (the naive sync of the CPU reference rollout, the pre-flight rule
E3's claim, and the online-FP8 engines a user builds with `quantization="fp8"`).

* `per_block_cast_to_fp8`: vLLM 0.26 `vllm/utils/deep_gemm.py:662-681` as it runs on CUDA: per 128x128 block,
  amax in fp32 clamped to 1e-4, sf = amax * fp32(1 / 448) (CUDA's tensor / scalar is a multiply by the
  reciprocal; `amax / 448` differs in ~40 % of blocks), q = e4m3(x * (1 / sf)). What vLLM's `fp8_per_block`
  online method and fp8check's vLLM adapter (`quantize_online`, the naive sync) run; 0 differing codes or scales
  against vLLM's function and against a real `fp8_per_block` engine's installed state
  (tests/gpu/test_vllm_online_conformance.py; the results page names the run).
* `scaled_fp8_quant_per_tensor`: vLLM's dynamic per-tensor `ops.scaled_fp8_quant(w, scale=None)` (the online
  `quantization="fp8"` of a BF16 checkpoint, `Fp8PerTensorOnlineLinearMethod`): one fp32 scale amax / 448 over
  the whole (fused) parameter, q = e4m3(clamp(x * (1 / s), +-448)) (the kernel multiplies by the fp32 reciprocal).
  The installed weight is the transpose (`[K, N]`), one scale per fused parameter (q|k|v share one; MoE: one per
  expert). Held to `ops.scaled_fp8_quant` and to a real `quantization="fp8"` engine after BF16 reloads, code for
  code and scale for scale, by tests/gpu/test_vllm_online_conformance.py and tests/gpu/test_online_engine.py.
* `per_token_activation_quant`: the activations of those GEMMs, dynamic per token (CUTLASS): s_t = max(amax_t / 448,
  1 / (448 * 512)), q = e4m3(x / s_t).
* `amax_over_448_blockwise`: the senders' formula (SkyRL's blockwise wire, verl's Triton kernel): per 128x128 block
  scale_inv = max(amax, eps) / 448, q = e4m3(x / scale_inv) -- not an engine's rule, and not Transformer Engine's
  (rule E3).
"""
from __future__ import annotations

import torch

from ..formats.blockwise import pad_blocks
from ..formats.cast import cast_to_fp8
from ..formats.constants import E4M3_MAX
from ..kinds import Granularity

MIN_SCALING_FACTOR = 1.0 / (E4M3_MAX * 512.0)      # vLLM's min_scaling_factor<e4m3>


def _blocks(w: torch.Tensor, block) -> torch.Tensor:
    return pad_blocks(w, tuple(block))                  # [Nb, bn, Kb, bk], zero padding (counts as 0 in amax)


def _unblock(q: torch.Tensor, n: int, k: int) -> torch.Tensor:
    return q.reshape(q.shape[0] * q.shape[1], q.shape[2] * q.shape[3])[:n, :k].contiguous()


def per_block_cast_to_fp8(w: torch.Tensor, block=(128, 128), fp8_dtype=torch.float8_e4m3fn):
    """(codes [N, K], scale_inv fp32 [ceil(N/bn), ceil(K/bk)]) as vLLM's per_block_cast_to_fp8(use_ue8m0=False);
    stacked experts ([E, N, K]) quantize expert by expert."""
    if w.dim() > 2:
        parts = [per_block_cast_to_fp8(x, block, fp8_dtype) for x in w]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    n, k = w.shape
    xv = _blocks(w, block)
    # CUDA's tensor / scalar multiplies by the scalar's fp32 reciprocal: vLLM's sf is amax * fp32(1 / 448), which
    # differs from amax / 448 in the last bit of ~40 % of blocks (measured on the H200, ci/probe_per_block.py)
    sf = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4) * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)
    q = (xv * (1.0 / sf)).to(fp8_dtype)
    return _unblock(q, n, k), sf.reshape(xv.shape[0], xv.shape[2]).contiguous()


def scaled_fp8_quant_per_tensor(w: torch.Tensor, fp8_dtype=torch.float8_e4m3fn, scale: torch.Tensor | None = None):
    """(codes as w's shape, scale fp32 [1]): vLLM's dynamic per-tensor quantization of one (fused) tensor
    (csrc/.../w8a8/fp8/common.cu: scale = amax / 448 in fp32, no floor; each value times the fp32 reciprocal,
    fmaxf(-448, fminf(x, 448)), a saturating cast). fminf/fmaxf drop a NaN operand, so a NaN product (0 * inf on
    an all-zero tensor, whose scale is 0; a NaN weight) becomes 448. `scale` given: the same conversion with
    that scale (a slice of a tensor quantized whole)."""
    s = (w.abs().amax().float() / E4M3_MAX).reshape(1) if scale is None else scale.float().reshape(1)
    x = w.float() * (1.0 / s)
    x = torch.where(torch.isnan(x), torch.full_like(x, E4M3_MAX), x).clamp(-E4M3_MAX, E4M3_MAX)
    return cast_to_fp8(x, fp8_dtype), s


def online_fp8_weight(w: torch.Tensor, fp8_dtype=torch.float8_e4m3fn):
    """What `Fp8PerTensorOnlineLinearMethod.process_weights_after_loading` installs for a fused BF16 parameter
    [N, K]: (the codes' transpose [K, N], a view as vLLM's `qweight.t()`, scale [1])."""
    q, s = scaled_fp8_quant_per_tensor(w, fp8_dtype)
    return q.t(), s


def per_token_activation_quant(x: torch.Tensor, fp8_dtype=torch.float8_e4m3fn) -> torch.Tensor:
    """The dequantized activations of an online per-tensor FP8 GEMM (dynamic per-token scales)."""
    s = (x.abs().amax(dim=-1, keepdim=True).float() / E4M3_MAX).clamp(min=MIN_SCALING_FACTOR)
    return cast_to_fp8(x.float() / s, fp8_dtype).float() * s


def per_tensor_activation_quant(x: torch.Tensor, fp8_dtype=torch.float8_e4m3fn) -> torch.Tensor:
    """The dequantized activations of vLLM's online per-tensor Triton MoE (dynamic per tensor, scaled_fp8_quant)."""
    q, s = scaled_fp8_quant_per_tensor(x, fp8_dtype)
    return q.float() * s


def amax_over_448_blockwise(w: torch.Tensor, block=(128, 128), eps: float = 1e-10, fp8_dtype=torch.float8_e4m3fn):
    """The senders' blockwise formula (SkyRL's wire, verl's Triton kernel): scale_inv = max(amax, eps) / 448,
    q = e4m3(x / scale_inv)."""
    if w.dim() > 2:
        parts = [amax_over_448_blockwise(x, block, eps, fp8_dtype) for x in w]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    n, k = w.shape
    xv = _blocks(w.float(), block)
    s = xv.abs().amax(dim=(1, 3), keepdim=True).clamp(min=eps) / E4M3_MAX
    return _unblock(cast_to_fp8(xv / s, fp8_dtype), n, k), s.reshape(xv.shape[0], xv.shape[2]).contiguous()


__all__ = ["E4M3_MAX", "MIN_SCALING_FACTOR", "amax_over_448_blockwise", "online_engine_state_hf", "online_fp8_weight",
           "online_quantize", "per_block_cast_to_fp8", "per_tensor_activation_quant",
           "per_token_activation_quant", "scaled_fp8_quant_per_tensor"]


def online_quantize(w: torch.Tensor, recipe):
    """What an engine quantizing a BF16 (fused) parameter itself installs, on the engine's grid
    (`SyncConfig.engine_recipe`): (codes as w's shape, scale). Per tensor: `scaled_fp8_quant_per_tensor`, one
    scale per parameter, routed experts ([E, N, K]) one per expert (scale [E, 1]); per block: `per_block_cast_to_fp8`;
    MXFP8: the OCP rule. Codes are in checkpoint orientation ([N, K]): vLLM's per-tensor method stores their
    transpose, which its adapter undoes when it reads them."""
    if recipe.granularity is Granularity.TENSOR:
        if w.dim() > 2:
            parts = [scaled_fp8_quant_per_tensor(x, recipe.fp8_dtype) for x in w]
            return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        return scaled_fp8_quant_per_tensor(w, recipe.fp8_dtype)
    if recipe.granularity is Granularity.MXFP8:
        from ..formats import quantize_mxfp8
        return quantize_mxfp8(w, recipe.fp8_dtype)
    return per_block_cast_to_fp8(w.float(), recipe.block_shape, recipe.fp8_dtype)


def online_engine_state_hf(config, sent: dict) -> dict:
    """What an engine quantizing BF16 itself (`rollout.quantization` online-per-block, online-per-tensor or
    nemo-rl-blockwise) must hold after a correct sync of `sent`, in checkpoint names. vLLM's online methods: each
    fused parameter (q|k|v, gate|up, experts) quantized whole by the engine's rule (`online_quantize`) -- as its
    process_weights_after_loading does it, on every tensor-parallel rank's shard -- and cut back into its
    checkpoint tensors (codes + `_scale_inv`: block grids, or per tensor `[tp]`, rank r's scale of the parameter
    the tensor sits in); NeMo RL's load path: each checkpoint tensor quantized on its own by NeMo RL's rule
    (`nemo_rl.engine_state_hf`); high-precision tensors as sent. The checks then judge the engine against it as
    they judge a checkpoint engine against the learner's bytes."""
    if config.engine_quantizes_on_load:
        from .nemo_rl import engine_state_hf
        return engine_state_hf(config, sent)
    from ..layouts import is_scale_name, scale_name
    from ..layouts.pieces import assemble
    layout, recipe = config.layout, config.engine_recipe
    weights = {n: t for n, t in sent.items() if not is_scale_name(n)}
    ranks = []
    for r in range(config.rollout.tp_size):
        pieces = [p for p in layout.vllm_load_pieces(r) if not is_scale_name(p.src)]     # BF16 in: no scales
        params = assemble(pieces, weights, layout.vllm_param_shapes(r))
        out = {}
        for n, t in params.items():
            if n in layout.fp8_vllm:
                out[n], out[scale_name(n)] = online_quantize(t, recipe)
            else:
                out[n] = t
        ranks.append(out)
    hf = layout.vllm_to_hf(layout.ranks_to_params(ranks), with_scales=True)
    return {**hf, **{n: t for n, t in sent.items() if n in config.kv_scale_names}}
