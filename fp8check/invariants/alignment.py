"""A family: alignment rules (FP8 GEMM multiples, 128-divisibility after tensor-parallel sharding, one
TP/CP-aware packed-sequence padding rule)."""
from __future__ import annotations

from fp8check.harness.alignment import fp8_gemm_multiple, packed_pad_multiple
from fp8check.harness.layouts.megatron import megatron_pieces
from fp8check.harness.layouts.vllm import tp_split_dim, vllm_module
from fp8check.harness.models import LINEAR

from .base import CheckContext, fail, invariant


@invariant("A1", "alignment", "FP8 GEMM dims",
           "every FP8 GEMM weight has both dims divisible by 16 (32 for MXFP8)", live=False,
           source="fp8check's own; Transformer Engine / cuBLASLt FP8 GEMMs need dims that are multiples of 16 (32 for"
                  " MXFP8's 1x32 blocks)",
           why='An FP8 GEMM with other dims falls back or fails. Exclude the tensor, or pad the model.')
def a1_gemm(ctx: CheckContext):
    cfg, out = ctx.config, []
    m = fp8_gemm_multiple(cfg.recipe)
    for t in cfg.spec.tensors():
        if t.name in cfg.fp8_tensors and (t.shape[0] % m or t.shape[1] % m):
            out.append(fail("A1", t.name, f"FP8 GEMM [{t.shape[0]}, {t.shape[1]}] not divisible by {m}"))
    return out


def _shards(cfg):
    """(what, tensor, dim, size) for every FP8 dim that tensor parallelism splits, trainer and rollout."""
    for side, tp in (("rollout", cfg.rollout.tp_size), ("trainer", cfg.trainer.tp_size)):
        if tp == 1:
            continue
        for t in cfg.spec.tensors():
            if t.name not in cfg.fp8_tensors or t.kind != LINEAR:
                continue
            dim = tp_split_dim(t.module)
            yield side, tp, t, dim, t.shape[dim]


@invariant("A2", "alignment", "128-divisible after tensor-parallel sharding",
           "quantizable weights have both dims divisible by the block (128; 32 along K for MXFP8) after "
           "tensor-parallel sharding, and fused members start on block boundaries, so codes and block scales "
           "shard and split together", live=False,
           source="vLLM 0.26 model_executor/layers/quantization/utils/fp8_utils.py:1196-1245 "
                  "(validate_fp8_block_shape: block-FP8 partitions must be multiples of the block under TP); SkyRL "
                  "pre-checks only the MXFP8 GDN in_proj (K13)",
           why="Tensor parallelism splits codes and block scales together only on block boundaries; otherwise the "
               "engine refuses the layer or shards the scales wrong. Pick a TP that keeps every FP8 shard a multiple "
               "of 128 (32 along K for MXFP8).",
           backstop="tp_breaks_block_divisibility")
def a2_sharding(ctx: CheckContext):
    cfg, out = ctx.config, []
    bn, bk = cfg.recipe.block_shape
    for side, tp, t, dim, size in _shards(cfg):
        blk = bn if dim == 0 else bk
        if size % tp or (size // tp) % blk:
            out.append(fail("A2", t.name, f"{side} TP={tp} splits dim {dim} ({size}) into {size / tp:g}, not a "
                            f"multiple of {blk}", key=f"{side}.tp_size"))
    kv = cfg.spec.num_kv_heads
    if cfg.rollout.tp_size > 1 and kv % cfg.rollout.tp_size:
        out.append(fail("A2", None, f"rollout TP={cfg.rollout.tp_size} does not divide {kv} KV heads",
                        key="rollout.tp_size"))
    for p in megatron_pieces(cfg.spec)[0]:
        if p.dst in cfg.fp8_tensors and (p.src_row % bn or p.rows % bn):
            out.append(fail("A2", p.dst, f"trainer GEMM {p.src} holds it at rows {p.src_row}:{p.src_row + p.rows}, "
                            f"not on {bn}-row block boundaries"))
    for t in cfg.spec.tensors():
        vmod, shard = vllm_module(cfg.spec, t.module)
        del vmod
        if shard is not None and t.name in cfg.fp8_tensors and t.shape[0] % bn:
            out.append(fail("A2", t.name, f"fused into a vLLM GEMM with {t.shape[0]} rows, not a multiple of {bn}"))
    return out


@invariant("A3", "alignment", "one packed-sequence padding rule",
           "packed sequences are padded to one TP/CP/FP8-aware multiple, the same in collation, preprocessing and "
           "replay", live=False,
           source="SkyRL skyrl/backends/skyrl_train/distributed/megatron/packing_utils.py:9-43 (_fp8_token_align) and"
                  " train/dataset/collators.py:145-154 ('MUST stay in lockstep with the worker's "
                  "preprocess_packed_seqs ... silently corrupt loss/grads'); NeMo RL "
                  "nemo_rl/models/megatron/data.py:1296-1326",
           why="Collation, preprocessing and replay must pad packed sequences to one TP/CP/FP8-aware multiple; a "
               "stage that pads differently shifts tokens silently. Leave the packing multiples unset (fp8check "
               "derives one).")
def a3_packing(ctx: CheckContext):
    cfg, out = ctx.config, []
    rule = packed_pad_multiple(cfg.trainer.tp_size, cfg.trainer.cp_size, cfg.recipe)
    for stage in ("collate", "preprocess", "replay"):
        v = getattr(cfg.packing, f"{stage}_multiple")
        if v is not None and v != rule:
            out.append(fail("A3", None, f"{stage} pads packed sequences to a multiple of {v}, the rule gives {rule} "
                            f"(TP={cfg.trainer.tp_size}, CP={cfg.trainer.cp_size}, {cfg.recipe.name})",
                            key=f"packing.{stage}_multiple"))
    return out
