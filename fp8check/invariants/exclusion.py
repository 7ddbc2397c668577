"""X family: the exclusion set (tensors kept in high precision) as a config-level contract. S6 checks that the
engines agree with it; X checks that it is a set both engines *can* agree on."""
from __future__ import annotations

import re

from fp8check.harness.kinds import Granularity
from fp8check.harness.patterns import matches
from fp8check.harness.layouts.megatron import megatron_pieces
from fp8check.harness.layouts.vllm import vllm_module
from fp8check.harness.models import LINEAR

from .base import CheckContext, fail, invariant


def _linears(cfg):
    return [t for t in cfg.spec.tensors() if t.kind == LINEAR]


@invariant("X1", "exclusion", "exact exclusion matching",
           "every exclusion pattern matches whole module names at component boundaries (`mlp.gate` never matches "
           "`gate_up_proj` / `gate_proj`); a regex selects one kind of module, and every pattern matches something",
           live=False,
           source="fp8check's own; vLLM matches Fp8Config ignored_layers exactly and ModelOpt by substring "
                  "(model_executor/layers/quantization/utils/quant_utils.py:510-560); NeMo RL PR #3614 review (router"
                  " substrings)",
           why="Substring or regex exclusions confuse routers with gate_proj / gate_up_proj, and a typo silently "
               "quantizes the layer. Name whole modules.")
def x1_exact(ctx: CheckContext):
    cfg, out = ctx.config, []
    mods = sorted({t.module for t in cfg.spec.tensors()})
    for p in cfg.exclude_patterns:
        hit = [m for m in mods if matches(m, p)]
        if not hit and p in cfg.exclude:      # a model default may not apply to every variant; a user's typo does
            out.append(fail("X1", None, f"exclusion pattern {p!r} matches no module (vLLM matches ignored_layers by "
                            "exact name: a typo silently quantizes the layer)", key="exclude", pattern=p))
            continue
        leaves = sorted({re.sub(r"\.\d+\.", ".N.", m.split("layers.", 1)[-1]).split(".", 1)[-1] if "layers." in m
                         else m for m in hit})
        if p.startswith("re:") and len(leaves) > 1:
            out.append(fail("X1", None, f"regex {p!r} matches several kinds of module {leaves[:6]}: substring "
                            "matching quantization exclusions is how routers and gate_proj get confused",
                            key="exclude", pattern=p))
    return out


def _scheme_groups(cfg) -> list[tuple[str, list[str]]]:
    """Groups of HF GEMM weights that share one GEMM (vLLM fusion and Megatron fusion)."""
    groups: dict[str, list[str]] = {}
    for t in _linears(cfg):
        vmod, shard = vllm_module(cfg.spec, t.module)
        if shard is not None and not isinstance(shard, tuple):
            groups.setdefault("vllm:" + vmod, []).append(t.name)
    for p in megatron_pieces(cfg.spec)[0]:
        groups.setdefault("megatron:" + p.src, [])
        if p.dst not in groups["megatron:" + p.src]:
            groups["megatron:" + p.src].append(p.dst)
    return [(k, v) for k, v in groups.items() if len(v) > 1]


def _mixed_groups(cfg, kind: str):
    """(group, FP8 members, high-precision members) for every fused GEMM of `kind` whose GEMM weights disagree."""
    for g, members in _scheme_groups(cfg):
        if g.startswith(kind):
            lin = [m for m in members if m.endswith(".weight")]
            fp8 = [m for m in lin if m in cfg.fp8_tensors]
            if fp8 and len(fp8) != len(lin):
                yield g[len(kind):], fp8, [m for m in lin if m not in fp8]


@invariant("X2", "exclusion", "fused shards share one scheme (engine)",
           "q|k|v, gate|up and other GEMMs vLLM fuses are all FP8 or all high precision (vLLM raises otherwise)",
           live=False,
           source="vLLM 0.26 model_executor/layers/quantization/utils/quant_utils.py:540-559 (is_layer_skipped raises"
                  " 'Detected some but not all shards of ... are quantized')",
           why="vLLM fuses q|k|v and gate|up into one GEMM with one scheme and refuses a mixed exclusion at engine "
               "start. Exclude all members of a fused GEMM or none.",
           backstop="exclusion_splits_fused_gemm")
def x2_engine_fusion(ctx: CheckContext):
    return [fail("X2", g, f"fused GEMM mixes FP8 {fp8} and high precision {hp}", key="exclude")
            for g, fp8, hp in _mixed_groups(ctx.config, "vllm:")]


def split_message(cfg, gemm: str, high: list[str]) -> str:
    """What a split of the trainer-fused GEMM `gemm` means, naming the GEMM, its members and those the engine
    serves in high precision (X3 at configuration time, S6 after a sync)."""
    members = [p.dst for p in megatron_pieces(cfg.spec)[0] if p.src == gemm]
    short = " | ".join(dict.fromkeys(m.rsplit(".", 2)[-2] for m in members))
    mods = ", ".join(m.rsplit(".", 1)[0] for m in high)
    return (f"the trainer runs [{short}] as one FP8 GEMM (Transformer Engine quantizes the fused tensor whole) "
            f"while the engine serves {mods} in high precision (the exclusion lists them): the sampler runs those "
            f"members off the learner's policy; exclude the whole fused GEMM or none of it")


@invariant("X3", "exclusion", "closed under the trainer's fusion",
           "GEMMs the trainer fuses (Megatron linear_qkv, linear_fc1, GDN in_proj [q|k|v|z|b|a]) are all FP8 or all "
           "high precision: a trainer cannot keep part of one GEMM in BF16, so an exclusion that lists part of one "
           "runs those members in FP8 in the trainer and in high precision in the engine", live=False,
           source="fp8check's own; Megatron-Core fuses linear_qkv, linear_fc1 and the GDN in_proj "
                  "(megatron/core/ssm/gated_delta_net.py); SkyRL's Qwen3.5 spec keeps GDN in_proj_a / in_proj_b BF16 "
                  "in vLLM (skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py:45-48, 77-133)",
           why="The trainer quantizes a fused GEMM as one tensor; it cannot keep part of it in BF16 while the engine "
               "does. Exclude the whole fused group.",
           backstop="exclusion_splits_fused_gemm")
def x3_trainer_fusion(ctx: CheckContext):
    return [fail("X3", g, split_message(ctx.config, g, hp), key="exclude", fp8=fp8, high_precision=hp)
            for g, fp8, hp in _mixed_groups(ctx.config, "megatron:")]


@invariant("X4", "exclusion", "unquantizable GEMMs are excluded",
           "a GEMM whose output or input dim is not a multiple of the weight block (MoE router, shared-expert "
           "gate, GDN a/b projections) is in the exclusion set (vLLM otherwise fails in its first forward)",
           live=False,
           source="SkyRL skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py:77-133 (in_proj_a/b ignored: the"
                  " 32-row shard is not 128-divisible); vLLM 0.26 "
                  "model_executor/layers/quantization/utils/fp8_utils.py:1196-1245 (validate_fp8_block_shape)",
           why="A GEMM whose dims are not multiples of the weight block cannot carry block scales; vLLM fails in its "
               "first forward. Add it to the exclusion set.",
           backstop="router_exclusion_dropped")
def x4_unquantizable(ctx: CheckContext):
    cfg, out = ctx.config, []
    if cfg.recipe.granularity != Granularity.BLOCK:
        return out
    bn, bk = cfg.recipe.block_shape
    for t in _linears(cfg):
        if t.name in cfg.fp8_tensors and (t.shape[0] % bn or t.shape[1] % bk):
            out.append(fail("X4", t.name, f"FP8 declared for a [{t.shape[0]}, {t.shape[1]}] GEMM, not a multiple of "
                            f"the {bn}x{bk} block; add {t.module.split('layers.')[-1].split('.', 1)[-1]!r} to "
                            "the exclusion set", key="exclude"))
    return out


@invariant("X5", "exclusion", "engine-forced high precision agrees",
           "modules the engine's model class always builds unquantized (vLLM Qwen3-MoE shared_expert_gate) are "
           "high precision in the trainer too", live=False,
           source="vLLM 0.26 model_executor/models/qwen3_moe.py:184-190 (shared_expert_gate is a ReplicatedLinear "
                  "with quant_config=None)",
           why="The engine builds this GEMM in BF16 whatever ignored_layers says; a trainer that quantizes it runs "
               "another policy. Keep it in the exclusion set.",
           backstop="shared_expert_gate_quantized")
def x5_forced(ctx: CheckContext):
    cfg, out = ctx.config, []
    for t in _linears(cfg):
        if t.name in cfg.fp8_tensors and any(matches(t.module, p) for p in cfg.spec.engine_high_precision):
            out.append(fail("X5", t.name, "the engine keeps this GEMM in BF16 whatever ignored_layers says; the "
                            "trainer must too", key="exclude"))
    return out
