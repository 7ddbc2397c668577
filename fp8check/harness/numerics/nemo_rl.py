"""NeMo RL's FP8 generation rule (`rollout.quantization=nemo-rl-blockwise`), as NVIDIA-NeMo/RL runs it at 7ea279ab
(nemo_rl/models/generation/vllm/quantization/fp8.py): vLLM is started as a block-FP8 *checkpoint* engine
(`quantization="fp8"`, `hf_overrides.quantization_config` = weight_block_size [128, 128] + the ignored layers NeMo
derives from `num_first/last_layers_in_bf16` and `quantization_ignored_layer_kws`, fp8.py:189-312), and every
refit's BF16 tensors pass through NeMo's own `load_weights` (fp8.py:476-530): a tensor whose vLLM module holds FP8
weights is quantized on its own -- one checkpoint tensor at a time, before vLLM's loaders fuse q|k|v or gate|up --
by `cast_tensor_to_fp8_blockwise` (fp8.py:533-620), and loaded with its `_scale_inv`; every other tensor is loaded
as sent. The engine's own post-load step (DeepGEMM's UE8M0 requantization where E8M0 is on) follows, as for any
checkpoint engine.

`cast_to_fp8_blockwise` re-states that function, operation for operation:

* the input is the tensor as float32 (`v.to(torch.float)`), 2-D;
* a shape that is not a whole number of 128x128 blocks is padded to one with the tensor's *last element*
  (`F.pad(..., value=data_hp[-1, -1])`), not zeros: the padding takes part in the edge blocks' amax;
* amax per block, no floor: `max_abs`;
* FP32 scales: `scale_fp = max_dtype / max_abs`, a Python float divided by a tensor, which PyTorch evaluates as
  `max_abs.reciprocal() * 448` (Tensor.__rtruediv__: one rounding for the reciprocal, one for the product -- not
  Transformer Engine's correctly rounded 448 / amax, nor vLLM's amax * (1 / 448)); amax 0 or inf -> scale 1;
  `scale_inv = reciprocal(scale_fp)`;
* power-of-two scales (`pow2_weight_scaling_factors`): exponent = clamp(ceil(log2(amax / 448)), -127, 127),
  biased by 127 into a uint8; scale_fp = 2^(127 - biased) (1 where the biased exponent is 0), scale_inv its
  reciprocal. `amax / 448` is a tensor divided by a Python float: on CUDA, where NeMo runs, a multiply by the fp32
  reciprocal of 448, which is what this re-statement computes (on BF16 weights the two roundings give the same
  power of two: an 8-bit mantissa over 7 lands on a power of two only exactly);
* codes = e4m3(clamp(x * scale_fp, -448, 448)), NaN left to the cast.

`engine_state_hf` is what such an engine must hold after a correct refit of `sent` (checkpoint names), the rule
fp8check's checks judge a NeMo RL engine by, as `online.online_engine_state_hf` is vLLM's online methods'.
"""
from __future__ import annotations

import torch

from ..formats.constants import E4M3_MAX
from ..kinds import ScaleFormat

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
NEMO_RL_FP8 = "nemo_rl/models/generation/vllm/quantization/fp8.py"
BLOCK = (128, 128)          # FP8_BLOCK_QUANT_KWARGS["weight_block_size"], fp8.py:37-42


def cast_to_fp8_blockwise(w: torch.Tensor, block=BLOCK, pow2: bool = False, fp8_dtype=torch.float8_e4m3fn):
    """(codes as w's shape, scale_inv fp32 [ceil(N/bn), ceil(K/bk)]): NeMo RL's `cast_tensor_to_fp8_blockwise`
    of one 2-D checkpoint tensor, its scale squeezed as its `load_weights` does."""
    if w.dim() != 2:
        raise ValueError(f"NeMo RL quantizes 2-D tensors only (fp8.py:537), got shape {tuple(w.shape)}")
    bn, bk = block
    x = w.to(torch.float32)
    n, k = x.shape
    pad0, pad1 = (-n) % bn, (-k) % bk
    if pad0 or pad1:            # with the last element, as NeMo pads
        x = torch.nn.functional.pad(x, (0, pad1, 0, pad0), mode="constant", value=float(x[-1, -1]))
    gn, gk = x.shape[0] // bn, x.shape[1] // bk
    blocks = x.reshape(gn, bn, gk, bk).permute(0, 2, 1, 3).reshape(gn, gk, bn * bk)
    max_abs = blocks.abs().amax(dim=-1, keepdim=True)
    if pow2:
        descale = max_abs * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)    # CUDA's tensor / scalar
        exponent = (torch.clamp(torch.ceil(torch.log2(descale)), min=-127, max=127) + 127).to(torch.uint8)
        scale_fp = torch.where(exponent == 0, torch.ones_like(max_abs),
                               torch.exp2(127 - exponent.to(torch.float32)))
    else:
        scale_fp = max_abs.reciprocal() * E4M3_MAX          # how PyTorch evaluates 448.0 / max_abs
        scale_fp = torch.where(max_abs == 0, torch.ones_like(scale_fp), scale_fp)
        scale_fp = torch.where(max_abs == torch.inf, torch.ones_like(scale_fp), scale_fp)
    scale_inv = scale_fp.reciprocal()
    codes = torch.clamp(blocks * scale_fp, min=-E4M3_MAX, max=E4M3_MAX).to(fp8_dtype)
    codes = codes.reshape(gn, gk, bn, bk).permute(0, 2, 1, 3).reshape(gn * bn, gk * bk)[:n, :k].contiguous()
    return codes, scale_inv.squeeze(-1).contiguous()


def quantize(w: torch.Tensor, recipe, cast=None):
    """One checkpoint tensor as NeMo RL's load path quantizes it, on the engine's grid (`recipe`: blockwise, FP32
    or power-of-two scales). `cast`: the 2-D quantizer (default: `cast_to_fp8_blockwise`; NeMo RL's own
    function can stand in, called as NeMo calls it: float32 in, `weight_block_size` as a list)."""
    pow2 = recipe.scale_format is ScaleFormat.POW2
    if cast is None:
        return cast_to_fp8_blockwise(w, tuple(recipe.block_shape), pow2, recipe.fp8_dtype)
    q, s = cast(w.to(torch.float), weight_block_size=list(recipe.block_shape))
    return q, torch.squeeze(s, dim=-1)


def load_weights(items, fp8_names, recipe, cast=None):
    """NeMo RL's `load_weights` (fp8.py:476-530) over (name, tensor[, version]) items: a tensor named in
    `fp8_names` (the engine's FP8 weights, in checkpoint names) is quantized and followed by its `_scale_inv`;
    everything else passes as sent. Whatever arrives under an FP8 weight's name is quantized, FP8 codes too (NeMo
    casts them to float and quantizes again): the engine takes BF16."""
    for item in items:
        name, t, rest = item[0], item[1], tuple(item[2:])
        if name in fp8_names:
            q, s = quantize(t, recipe, cast)
            yield (name, q, *rest)
            yield (name + "_scale_inv", s, *rest)
        else:
            yield item


def engine_state_hf(config, sent: dict) -> dict:
    """What a NeMo RL FP8 generation engine must hold after a correct refit of `sent` (BF16, checkpoint names), in
    checkpoint names: each of the engine's FP8 weights quantized on its own by NeMo RL's rule (codes + `_scale_inv`
    on the checkpoint tensor's own block grid), every other tensor as sent."""
    from ..layouts import is_scale_name
    recipe, fp8 = config.engine_recipe, config.engine_fp8_tensors
    weights = [(n, t) for n, t in sent.items() if not is_scale_name(n)]
    out = dict(load_weights(weights, fp8, recipe))
    return {**out, **{n: t for n, t in sent.items() if n in config.kv_scale_names}}


__all__ = ["BLOCK", "NEMO_RL_COMMIT", "NEMO_RL_FP8", "cast_to_fp8_blockwise", "engine_state_hf", "load_weights",
           "quantize"]
