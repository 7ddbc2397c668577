"""Exclusion faults: a norm quantized on the trainer side, a linear left BF16 in the engine only, the MoE router
quantized by the engine, a substring exclusion pattern."""
from __future__ import annotations

from dataclasses import replace

from fp8check.harness.formats import quantize_per_tensor
from fp8check.harness.kinds import Granularity

from .base import Fault, fp8_targets, pick, register


def _norm_quantized(c, hf, trainer, layer=0):
    n = f"{c.spec.layer_prefix(layer)}input_layernorm.weight"
    q, s = quantize_per_tensor(hf[n].float())
    hf[n] = q
    return hf


register(Fault("norm_quantized_in_trainer", "exclusion", "trainer", ("S6", "S5"),
               "the trainer's forward runs one RMSNorm weight in FP8 while the config keeps norms in BF16",
               _norm_quantized))


def _engine(ignored):
    def apply(c, index=0):
        from fp8check.harness.engines.cpu.rollout import ReferenceRollout
        return ReferenceRollout(c, ignored_layers=ignored(c, index))
    return apply


def _extra_ignored(c, index):
    return tuple(c.ignored_layers) + (pick(fp8_targets(c, suffix=("o_proj", "down_proj", "out_proj")), index)
                                      .rsplit(".", 1)[0],)


register(Fault("linear_bf16_in_engine_only", "exclusion", "engine", ("S6", "S5", "S1", "S2", "S3", "S4", "S7"),
               "the engine's ignored_layers lists a linear the trainer quantizes (BF16 on one side only)",
               _engine(_extra_ignored)))


def _router_not_ignored(c, index):
    return tuple(m for m in c.ignored_layers if not m.endswith(".mlp.gate"))


register(Fault("router_quantized_in_engine", "exclusion", "engine", ("S6", "S5", "S1", "S4"),
               "the engine's ignored_layers misses the MoE router: vLLM block-quantizes mlp.gate",
               _engine(_router_not_ignored), applies=lambda c: c.spec.is_moe))


def _substring(c):
    return replace(c, exclude=tuple(c.exclude) + ("re:.*gate.*",))


register(Fault("exclusion_substring_match", "exclusion", "config", ("X1", "X2", "X3"),
               "an exclusion written as a substring pattern ('gate') that also catches gate_proj / gate_up_proj "
               "beside the router (where there is a router to confuse them with)", _substring,
               applies=lambda c: c.spec.is_moe))


def _partial_fused(c):
    return replace(c, exclude=tuple(c.exclude) + ("self_attn.k_proj",))


register(Fault("exclusion_splits_fused_gemm", "exclusion", "config", ("X2", "X3"),
               "k_proj excluded but q_proj / v_proj quantized: one fused GEMM with two schemes",
               _partial_fused, applies=lambda c: "full_attention" in c.spec.layer_types))




# which further rules fire depends on the model and recipe: X4 on block recipes (the router's 8 rows are no
# 128-row block), X5 where a shared-expert gate exists, and the engine's refusal or the S family where it builds
register(Fault("model_exclusions_dropped", "exclusion", "config", ("A1",),
               "the model's own high-precision set dropped (router / shared-expert gate / GDN a,b quantized)",
               lambda c: replace(c, default_exclude=False), applies=lambda c: bool(c.spec.default_exclude),
               may=("A2", "X4", "X5", "S1", "S2", "S3", "S4", "S5", "S6", "S7")))


def _foreign_ignored(c, index=0):
    return tuple(c.ignored_layers) + (f"{c.spec.layer_prefix(0)}mlp.shared_expert_gate_proj",)


# vLLM skips names it does not have silently: numerically harmless today, and proof the engine's list is not the
# one exclusion set (the next model it is copied to may have that module)
register(Fault("engine_ignored_layers_foreign", "exclusion", "engine", ("S6",),
               "the engine's ignored_layers carries a module this model does not have (a quantization_config copied "
               "from another model's checkpoint)", _engine(lambda c, i: _foreign_ignored(c, i)), silent=True))


register(Fault("exclusion_pattern_typo", "exclusion", "config", ("X1",),
               "an exclusion pattern that names no module ('mlp.gaet'): vLLM matches ignored_layers by exact name, so "
               "the layer it meant is silently quantized", lambda c: replace(c, exclude=tuple(c.exclude) + ("mlp.gaet",))))


def _without_default(name):
    def apply(c):
        return replace(c, default_exclude=False, exclude=tuple(p for p in c.spec.default_exclude if p != name)
                       + tuple(c.exclude))
    return apply


register(Fault("router_exclusion_dropped", "exclusion", "config", ("X4", "A1"),
               "the MoE router (mlp.gate, 8 output rows) left out of the exclusion set: no 128-row block fits it",
               _without_default("mlp.gate"),
               applies=lambda c: "mlp.gate" in c.spec.default_exclude and c.recipe.granularity is Granularity.BLOCK,
               may=("A2", "S1", "S2", "S3", "S4", "S5", "S6", "S7")))
register(Fault("shared_expert_gate_quantized", "exclusion", "config", ("X5", "A1"),
               "the shared-expert gate quantized by the trainer while vLLM's Qwen3-MoE always builds it in BF16",
               _without_default("mlp.shared_expert_gate"),
               applies=lambda c: "mlp.shared_expert_gate" in c.spec.default_exclude,
               may=("A2", "X4", "S1", "S2", "S3", "S4", "S5", "S6", "S7")))


# prime-rl#2442: a router exclusion used as an unanchored regex (re.search semantics): `mlp.gate` also selects
# mlp.gate_proj, the gate half of the fused gate|up GEMM (X1 sees it only where it selects several kinds)
register(Fault("exclusion_unanchored_regex", "exclusion", "config", ("X2", "X3"),
               "the router exclusion 'mlp.gate' applied as an unanchored regex (searched, not matched), which also "
               "selects mlp.gate_proj: the gate half of gate|up in high precision, the up half in FP8",
               lambda c: replace(c, exclude=tuple(c.exclude) + ("re:.*mlp.gate.*",)),
               applies=lambda c: any(t.module.endswith(".mlp.gate_proj") for t in c.spec.tensors()), may=("X1",)))
