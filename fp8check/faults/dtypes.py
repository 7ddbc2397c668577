"""Dtype faults: E5M2 or fnuz bytes where e4m3fn is declared, a BF16 leak into an FP8 slot, an FP32 scale sent
as BF16."""
from __future__ import annotations

import torch

from fp8check.harness.formats import quantize_blockwise
from fp8check.harness.kinds import Granularity, ScaleFormat

from .base import Fault, fp8_targets, pick, register, replace_tensor, scale_name


def _e5m2(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    master = ctx.master_hf()[n].to(torch.bfloat16)
    q, s = quantize_blockwise(master, c.recipe.block_shape, pow2=c.recipe.pow2, fp8_dtype=torch.float8_e5m2)
    return replace_tensor(replace_tensor(p, n, q), scale_name(n), s.to(p.tensors[scale_name(n)].dtype))


register(Fault("e5m2_codes", "dtypes", "payload", ("S5", "S2", "S3", "S4"), "one weight quantized to E5M2 instead of E4M3",
               _e5m2, applies=lambda c: c.recipe.granularity is Granularity.BLOCK, destructive=True))


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
               applies=lambda c: c.recipe.scale_format is ScaleFormat.FP32))


def _zero_sign(c, p, ctx, index=0):
    """The sender canonicalizes negative zero: every 0x80 code of one weight becomes 0x00."""
    n = pick([x for x in fp8_targets(c) if bool((p.tensors[x].view(torch.uint8) == 0x80).any())], index)
    b = p.tensors[n].view(torch.uint8).clone()
    b[b == 0x80] = 0
    return replace_tensor(p, n, b.view(p.tensors[n].dtype))


# the values are equal (-0 == 0), the bytes are not: the one disagreement only byte identity names (what a
# digest-first check sees as a mismatch on every sync)
register(Fault("zero_sign_canonicalized", "dtypes", "payload", ("S2",),
               "the sender rewrites negative-zero codes (0x80) as +0 (0x00) in one weight: the values are equal, the "
               "learner's bytes are not", _zero_sign, silent=True))


def _hp_as_fp32(c, p, ctx, layer=0):
    n = f"{c.spec.layer_prefix(layer)}input_layernorm.weight"
    return replace_tensor(p, n, p.tensors[n].float())


# the engine's copy_ casts it back to BF16 exactly: only the wire's dtype is wrong (twice the bytes every sync)
register(Fault("hp_tensor_sent_as_fp32", "dtypes", "payload", ("S5",),
               "one BF16 tensor (an RMSNorm weight) sent as FP32; the engine casts it back silently", _hp_as_fp32,
               silent=True))


def _fallback_bf16(c, p, ctx, index=0):
    """The sender's quantizer raises on one weight; it sends the BF16 parameter instead, with no scale."""
    from fp8check.harness.sync.payload import ROLE_HP, record_for
    n = pick(fp8_targets(c), index)
    master = ctx.master_hf()[n].to(torch.bfloat16)
    recs = [record_for(n, ROLE_HP, master, r.version) if r.name == n else r for r in p.records
            if r.name != scale_name(n)]
    tensors = {k: (master if k == n else v) for k, v in p.tensors.items() if k != scale_name(n)}
    return type(p)(recs, tensors, p.version)


# seen in more than one stack (verl's fp8_utils yields the BF16 tensor when quantizing fails)
register(Fault("quantize_failure_sends_bf16", "dtypes", "payload", ("S5", "S6", "S1", "S2", "S4"),
               "quantizing one weight fails and the sender falls back to its BF16 parameter, without a scale: the "
               "engine's copy_ casts it into the FP8 slot", _fallback_bf16, may=("S3",)))
