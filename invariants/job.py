"""J family: rules over an RL job's own configuration (the keys as the user wrote them, read by
harness.jobconfig into a Job), which `fp8check preflight` runs beside the C/X/A rules over the SyncConfig the job
resolves to. Ids K*/M*/X6 are the published pre-flight rule ids.

Each rule's finding carries evidence `key` (the key or variable as written), `value` and `fix`.
"""
from __future__ import annotations

import difflib

from harness.jobconfig import FP8_PREFIXES, KNOWN, SKYRL_ENGINE, SKYRL_MEGATRON, SKYRL_REF_MEGATRON

from .base import CheckContext, fail, invariant


def _f(rule: str, key, value, why: str, fix: str = ""):
    return fail(rule, None, why, key=key, value=value, fix=fix)


@invariant("K1", "job", "every FP8 key is understood",
           "every key under an FP8-relevant prefix is one fp8check knows (a misspelled FP8 key silently changes "
           "nothing in the stack it was meant for)", needs=("job",), live=False)
def k1_unknown_keys(ctx: CheckContext):
    out = []
    for k, v in ctx.job.flat.items():
        if k in KNOWN or not any(k.startswith(p) for p in FP8_PREFIXES):
            continue
        near = difflib.get_close_matches(k, sorted(KNOWN), n=1, cutoff=0.8)
        out.append(_f("K1", k, v, "unknown key under an FP8-relevant prefix (fp8check cannot tell what it does to the "
                      "numerics)", f"did you mean {near[0]}?" if near else "remove it or report it to fp8check"))
    return out


@invariant("K2", "job", "the wire format's current name",
           "the SkyRL wire format is named `blockwise` (`serialized_blockwise` is the pre-August-2026 name)",
           needs=("job",), live=False, severity="warning")
def k2_old_name(ctx: CheckContext):
    j = ctx.job
    if j.wire_mode_written == "serialized_blockwise":
        return [_f("K2", j.wire_mode_key, j.wire_mode_written, "old name of the blockwise mode", "write blockwise")]
    return []


@invariant("K3", "job", "wire format = trainer recipe",
           "the FP8 weight-sync wire format is the trainer's recipe (blockwise with blockwise, mxfp8 with mxfp8)",
           needs=("job",), live=False)
def k3_wire_recipe(ctx: CheckContext):
    j = ctx.job
    if j.wire_mode is not None and j.wire_mode != j.recipe_name:
        return [_f("K3", j.wire_mode_key, j.wire_mode, f"the wire format ({j.wire_mode}) is not the trainer's recipe "
                   f"({j.recipe_name}): the sampler runs another quantization than the learner",
                   f"set {j.wire_mode_key}={j.recipe_name} (or auto)")]
    return []


@invariant("K4", "job", "serialized FP8 sync into an FP8 engine",
           "a serialized FP8 weight sync needs the engine started with quantization=fp8", needs=("job",), live=False)
def k4_engine_quant(ctx: CheckContext):
    j = ctx.job
    if j.wire_mode is not None and j.rollout_quant not in (None, "fp8"):
        return [_f("K4", j.rollout_quant_key, j.rollout_quant, "serialized FP8 sync needs the engine started with "
                   "quantization=fp8", f"set {SKYRL_ENGINE}engine_init_kwargs.quantization=fp8 (or leave it unset)")]
    return []


@invariant("K5", "job", "an FP8 learner syncs FP8",
           "FP8 training with an FP8 rollout syncs the trainer's own FP8 codes and scales, never BF16 for the engine "
           "to re-quantize", needs=("job",), live=False)
def k5_naive(ctx: CheckContext):
    j = ctx.job
    if j.fp8_training and j.fp8_rollout and j.wire_mode is None:
        return [_f("K5", j.rollout_quant_key or j.wire_mode_key, j.rollout_quant, "FP8 training with a BF16 weight "
                   "sync: the engine re-quantizes with its own scales and samples a policy the learner never held (S2)",
                   "sync the trainer's own FP8 codes and scales (SkyRL: "
                   "generator.inference_engine.fp8_weight_sync_mode=blockwise)")]
    return []


@invariant("K6", "job", "an FP8 rollout of a BF16 learner is off-policy",
           "an FP8 rollout engine sampling for a BF16 learner runs another policy by construction",
           needs=("job",), live=False, severity="warning")
def k6_bf16_learner(ctx: CheckContext):
    j = ctx.job
    if j.fp8_rollout and not j.fp8_training:
        return [_f("K6", j.rollout_quant_key or j.wire_mode_key, j.rollout_quant or j.wire_mode, "FP8 rollout of a "
                   "BF16 learner is off-policy by construction",
                   "use importance-sampling correction (TIS) or train in FP8")]
    return []


@invariant("K7", "job", "persistent FP8 parameters need the FP8 all-gather",
           "fp8_param (persistent FP8 weights) needs ddp_config.fp8_param_gather=true", needs=("job",), live=False)
def k7_param_gather(ctx: CheckContext):
    j = ctx.job
    key = SKYRL_MEGATRON + "ddp_config.fp8_param_gather"
    if j.fp8_param and j.fp8_param_key and j.fp8_param_key.startswith(SKYRL_MEGATRON) and not j.flat.get(key, False):
        return [_f("K7", key, j.flat.get(key), "persistent FP8 parameters need the FP8 all-gather",
                   f"set {key}=true")]
    return []


@invariant("K8", "job", "FP8 weight sync needs the Megatron trainer",
           "serialized FP8 weight sync reads the FP8 forward weights from Transformer Engine: trainer.strategy is "
           "megatron", needs=("job",), live=False)
def k8_strategy(ctx: CheckContext):
    j = ctx.job
    if j.wire_mode is not None and j.stack == "skyrl" and j.strategy not in (None, "megatron"):
        return [_f("K8", "trainer.strategy", j.strategy, "serialized FP8 weight sync needs the Megatron trainer (the FP8 "
                   "forward weights come from Transformer Engine)", "set trainer.strategy=megatron")]
    return []


@invariant("K9", "job", "the reference model runs the learner's numerics",
           "the reference policy's fp8 / fp8_recipe / fp8_param equal the policy's (KL terms compare like with like)",
           needs=("job",), live=False, severity="warning")
def k9_reference(ctx: CheckContext):
    j, out = ctx.job, []
    for name in ("fp8", "fp8_recipe", "fp8_param"):
        for k in (SKYRL_REF_MEGATRON + "transformer_config_kwargs." + name, SKYRL_REF_MEGATRON + name):
            if k in j.flat:
                v = j.flat[k]
                mine = {"fp8": j.fp8_format, "fp8_recipe": j.recipe_name, "fp8_param": j.fp8_param}[name]
                if v != mine and not (name == "fp8_recipe" and v in ("auto", j.recipe_name)):
                    out.append(_f("K9", k, v, f"the reference model's {name} differs from the policy's ({mine}): KL "
                                  "terms compare different numerics", f"set it to {mine}"))
                break
    return out


@invariant("M1", "job", "the model's dims are known",
           "the job's model is a tiny model name or a local checkpoint with a config.json, so its shape, alignment and "
           "exclusion rules run on its real dims", needs=("job",), live=False, severity="warning")
def m1_model(ctx: CheckContext):
    j = ctx.job
    if not j.model_known:
        return [_f("M1", j.model_key, j.model_written, "model dims unknown here (not a tiny model name nor a local path "
                   "with config.json): shape, alignment and exclusion rules use tiny-dense",
                   "point the model path at a local checkpoint directory to check its dims")]
    return []


@invariant("M2", "job", "FP8 KV cache and linear attention",
           "an FP8 KV cache is not combined with gated delta-net (linear attention) layers on the FP8 sync path",
           needs=("job",), live=False, severity="warning")
def m2_kv_linear(ctx: CheckContext):
    j = ctx.job
    if j.kv_cache_dtype and "fp8" in str(j.kv_cache_dtype) and \
            any(t != "full_attention" for t in ctx.config.spec.layer_types):
        return [_f("M2", j.kv_cache_key, j.kv_cache_dtype, "FP8 KV cache with linear-attention layers is not supported "
                   "by the FP8 sync path yet", "leave kv_cache_dtype=auto")]
    return []


@invariant("X6", "exclusion", "the engine's ignored_layers come from the one exclusion set",
           "an explicit engine ignored_layers override equals the trainer's high-precision GEMMs exactly",
           needs=("job",), live=False)
def x6_override(ctx: CheckContext):
    j = ctx.job
    if j.ignored_layers is None:
        return []
    want, got = set(ctx.config.ignored_layers), set(j.ignored_layers)
    if got != want:
        return [_f("X6", j.ignored_layers_key, sorted(got ^ want)[:6], "the engine's ignored_layers differ from the "
                   f"trainer's high-precision set (missing {sorted(want - got)[:3]}, extra {sorted(got - want)[:3]})",
                   "derive ignored_layers from the same exclusion set (remove the override)")]
    return []
