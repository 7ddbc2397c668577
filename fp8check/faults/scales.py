"""Scale faults: bit flip, x2 on one block, scale <-> scale_inv swap, power-of-two rounding, epsilon mismatch,
block transpose, FP32 scales through vLLM's E8M0 requantization."""
from __future__ import annotations

from dataclasses import replace

import torch

from fp8check.harness.formats import E8M0
from fp8check.harness.kinds import Granularity, ScaleFormat

from .base import Fault, NoTarget, fp8_targets, pick, register, replace_tensor, scale_name, with_rollout, with_trainer


def _target(config, index):
    return scale_name(pick(fp8_targets(config), index))


def _flip_bit(c, p, ctx, index=0, element=0, bit=0):
    sn = _target(c, index)
    s = p.tensors[sn].clone()
    flat = s.view(torch.uint8).reshape(-1, s.element_size())
    bit %= 8 * s.element_size()             # a bit of this scale's encoding (E8M0: 8 bits, FP32: 32)
    flat[element % flat.shape[0], bit // 8] ^= (1 << (bit % 8))
    return replace_tensor(p, sn, s)


# one ulp of one block's scale: S3 names the bits; whether the dequantized values S4 compares move depends on
# the recipe (they did with FP32 and E8M0 scales, not with power-of-two ones, on the tiny models)
register(Fault("scale_bit_flip", "scales", "payload", ("S3",), "one bit of one block scale flipped by the sender",
               _flip_bit, silent=True, may=("S4",)))


def _times2(c, p, ctx, index=0, element=0):
    sn = _target(c, index)
    s = p.tensors[sn].clone()
    if s.dtype == E8M0:
        b = s.view(torch.uint8).reshape(-1)
        b[element % b.numel()] += 1
    else:
        s.reshape(-1)[element % s.numel()] *= 2
    return replace_tensor(p, sn, s)


register(Fault("scale_x2_block", "scales", "payload", ("S3", "S4"), "one block's scale_inv doubled",
               _times2, silent=True))


def _swap_inv(c, p, ctx, index=0):
    sn = _target(c, index)
    s = p.tensors[sn]
    if s.dtype == E8M0:
        inv = (254 - s.view(torch.uint8).to(torch.int32)).clamp(0, 254).to(torch.uint8).view(E8M0)
    else:
        inv = torch.ones_like(s) / s
    return replace_tensor(p, sn, inv)


register(Fault("scale_inv_swap", "scales", "payload", ("S3", "S4"),
               "the quantization scale sent where weight_scale_inv (its reciprocal) belongs", _swap_inv, silent=True))


def _round_pow2(c, p, ctx, index=None):
    names = fp8_targets(c) if index is None else [fp8_targets(c)[index]]
    for n in names:
        s = p.tensors[scale_name(n)]
        p = replace_tensor(p, scale_name(n), torch.exp2(torch.ceil(torch.log2(s.float()))))
    return p


register(Fault("fp32_scales_rounded_pow2", "scales", "payload", ("S3", "S4"),
               "FP32 scales rounded up to powers of two on the way, codes left as they were",
               _round_pow2, applies=lambda c: c.recipe.scale_format is ScaleFormat.FP32, silent=True))


def _sender_eps(c, p, ctx, index=0, amax_epsilon=1.0):
    """The sender re-quantizes one weight from the trainer's BF16 parameter with another amax epsilon."""
    n = pick(fp8_targets(c), index)
    master = ctx.master_hf()[n]
    r = replace(c.recipe, amax_epsilon=amax_epsilon)
    q, s = r.quantize_weight(master if c.trainer.fp8_param else master.to(torch.bfloat16))
    return replace_tensor(replace_tensor(p, n, q), scale_name(n), s)


register(Fault("sender_epsilon_mismatch", "scales", "payload", ("S2", "S3", "S4"),
               "the sender re-quantizes with another amax epsilon than the trainer's forward uses", _sender_eps,
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK, silent=True))


register(Fault("trainer_epsilon_mismatch", "scales", "config", ("C1", "C6"),
               "the trainer's quantizer runs with amax epsilon 1.0 while the sync declares 0",
               with_trainer(amax_epsilon=1.0), applies=lambda c: c.recipe.granularity is Granularity.BLOCK,
               silent=True))
register(Fault("trainer_pow2_scales", "scales", "config", ("C1", "C6", "C9"),
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES unset in the trainer: TE's power-of-two default while the sync "
               "declares FP32 scales", with_trainer(scale_format=ScaleFormat.POW2),
               applies=lambda c: c.recipe.scale_format is ScaleFormat.FP32, silent=True))


def _transpose_grid(c, p, ctx, index=0):
    cands = [n for n in fp8_targets(c) if p.tensors[scale_name(n)].dim() == 2
             and p.tensors[scale_name(n)].shape[0] == p.tensors[scale_name(n)].shape[1]]
    sn = scale_name(pick(cands, index))
    s = p.tensors[sn]
    t = s.t().contiguous()
    if torch.equal(t.view(torch.uint8), s.view(torch.uint8)):
        raise NoTarget("symmetric scale grid")
    return replace_tensor(p, sn, t)


register(Fault("scale_grid_transposed", "scales", "payload", ("S3", "S4"),
               "a square block-scale grid sent transposed (row-major vs column-major mix-up)", _transpose_grid,
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK, silent=True))


register(Fault("fp32_scales_through_e8m0", "scales", "config", ("C2", "C9", "S3", "S4"),
               "FP32 block scales installed into vLLM with its Hopper default (DeepGEMM + E8M0): post-load "
               "requantizes every weight to UE8M0", with_rollout(use_deep_gemm=True, deep_gemm_e8m0=True),
               applies=lambda c: c.recipe.scale_format is ScaleFormat.FP32))


# the trainer runs another amax epsilon than the sync declares, too small for any block's amax to reach yet: the
# bytes agree today (C1 holds), the disagreement is latent (a block of tiny weights changes its scale)
register(Fault("trainer_epsilon_latent", "scales", "config", ("C6",),
               "the trainer's quantizer runs with amax epsilon 1e-30 while the sync declares 0 (no block's amax is "
               "that small yet: the bytes still agree)", with_trainer(amax_epsilon=1e-30),
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK, silent=True))


def _nan_block(c, p, ctx, index=0, element=0):
    """A sender that computes scale_inv = amax / 448 sends NaN for a block whose amax is NaN (TE writes scale 1
    for such a block): every output that block feeds is NaN."""
    sn = _target(c, index)
    s = p.tensors[sn].clone()
    if s.dtype == E8M0:
        s.view(torch.uint8).reshape(-1)[element % s.numel()] = 0xFF      # E8M0's NaN
    else:
        s.reshape(-1)[element % s.numel()] = float("nan")
    return replace_tensor(p, sn, s)


# what NaN reaches the sampler's log-probs as: P1 fails on the non-finite metric, naming it
register(Fault("scale_nan_block", "scales", "payload", ("S3", "S4", "P1"),
               "one block's scale_inv is NaN (a sender's amax / 448 over a block holding a NaN weight; Transformer "
               "Engine writes scale 1 there)", _nan_block,
               may=("S1", "S2")))   # where post-load requantizes (UE8M0) or E8M0's NaN byte is the poison byte
