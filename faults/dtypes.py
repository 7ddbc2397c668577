"""Dtype faults: E5M2 or fnuz bytes where e4m3fn is declared, a BF16 leak into an FP8 slot, an FP32 scale sent
as BF16."""
from __future__ import annotations

import torch

from harness.formats import quantize_blockwise

from .base import Fault, fp8_targets, pick, register, replace_tensor, scale_name


def _e5m2(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    master = ctx.master_hf()[n].to(torch.bfloat16)
    q, s = quantize_blockwise(master, c.recipe.block_shape, pow2=c.recipe.pow2, fp8_dtype=torch.float8_e5m2)
    return replace_tensor(replace_tensor(p, n, q), scale_name(n), s.to(p.tensors[scale_name(n)].dtype))


register(Fault("e5m2_codes", "dtypes", "payload", ("S5", "S2", "S3", "S4"), "one weight quantized to E5M2 instead of E4M3",
               _e5m2, applies=lambda c: c.recipe.granularity == "block", destructive=True))


def _fnuz(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    return replace_tensor(p, n, p.tensors[n].view(torch.uint8).view(torch.float8_e4m3fnuz))


register(Fault("fnuz_codes", "dtypes", "payload", ("S5", "S2", "S4"),
               "one weight's bytes labelled float8_e4m3fnuz (the ROCm format, exponent bias 8)", _fnuz,
               destructive=True, may=("S1", "S3")))


def _bf16_leak(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    deq = c.recipe.dequantize_weight(p.tensors[n], p.tensors[scale_name(n)]).to(torch.bfloat16)
    return replace_tensor(p, n, deq)


register(Fault("bf16_into_fp8_slot", "dtypes", "payload", ("S5", "S2", "S4"),
               "one FP8 weight sent dequantized as BF16; the engine's copy_ silently casts it into the FP8 slot",
               _bf16_leak, may=("S3",)))


def _scale_bf16(c, p, ctx, index=0):
    sn = scale_name(pick(fp8_targets(c), index))
    return replace_tensor(p, sn, p.tensors[sn].float().to(torch.bfloat16))


register(Fault("fp32_scale_sent_as_bf16", "dtypes", "payload", ("S5", "S3", "S4"),
               "one FP32 scale tensor sent as BF16 (rounded to 8 mantissa bits)", _scale_bf16,
               applies=lambda c: c.recipe.scale_format == "fp32"))
