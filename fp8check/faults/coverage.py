"""Coverage faults: a dropped, duplicated or unknown tensor; a lost bucket."""
from __future__ import annotations

import torch

from fp8check.harness.sync.payload import ROLE_FP8

from .base import Fault, NoTarget, add, drop, fp8_targets, pick, register, scale_name


def _drop_scale(c, p, ctx, index=0):
    return drop(p, scale_name(pick(fp8_targets(c), index)))


# in the CPU mirror the weight keeps the poisoned scale, so its values and the probe's log-probs are NaN (P1
# fails on non-finite); vLLM 0.26 served log-probs within P1's bound (H200, 2026-12-01): P1 may fire, need not
register(Fault("scale_dropped", "coverage", "payload", ("S1", "S3", "S4"), "one weight_scale_inv never sent",
               _drop_scale, may=("S2", "P1")))


def _drop_norm(c, p, ctx, layer=0):
    return drop(p, f"{c.spec.layer_prefix(layer)}post_attention_layernorm.weight")


register(Fault("norm_dropped", "coverage", "payload", ("S1", "S4"), "one RMSNorm weight never sent (keeps its old value)",
               _drop_norm))


def _duplicate(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    return add(p, n, p.tensors[n], ROLE_FP8, after=scale_name(n))


# vLLM 0.26 can leave parameters on the meta device after a duplicated load (measured on the H200; the next
# reload repairs them): destructive, injected last in a live session
register(Fault("tensor_duplicated", "coverage", "payload", ("S1",),
               "one FP8 weight sent twice (the second load arrives after its module completed)", _duplicate,
               destructive=True, may=("S2", "S3", "S4")))


def _unknown(c, p, ctx):
    return add(p, f"{c.spec.layer_prefix(0)}mlp.extra_proj.weight", torch.zeros(128, 128, dtype=torch.bfloat16), "hp")


register(Fault("unknown_name", "coverage", "payload", ("S1", "S7"), "a tensor the engine has no parameter for",
               _unknown, destructive=True))


def _lose_bucket(c, buckets, which=-1):
    if len(buckets) < 2:
        raise NoTarget("one bucket only")
    return [b for i, b in enumerate(buckets) if i != which % len(buckets)]


register(Fault("bucket_lost", "coverage", "buckets", ("S1", "S4", "S7"), "one serialized bucket never arrives",
               _lose_bucket, configure=lambda c: c.with_(transport=type(c.transport)(bucket_bytes=1 << 20))))
