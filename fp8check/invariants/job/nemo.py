"""The checks NeMo RL runs on its FP8 config (its asserts, ValueErrors and KeyErrors), and what its keys mean
(NVIDIA-NeMo/RL at 7ea279ab): N1-N13. Paths are relative to NeMo RL's repository."""
from __future__ import annotations

from fp8check.harness.jobconfig.keys import NEMO_FP8, NEMO_MEGATRON, NEMO_VLLM
from fp8check.harness.jobconfig.stacks import required_high_precision

from ..base import CheckContext, invariant
from .common import NEEDS, NEMO_RL, finding, module_kind

GRPO = "nemo_rl/algorithms/grpo.py"
FP8 = "nemo_rl/models/generation/vllm/quantization/fp8.py"
KV_OK = ("auto", "fp8", "fp8_e4m3")


def _fp8_gen(j) -> bool:
    return j.value(NEMO_VLLM + "precision") == "fp8"


@invariant("N1", "job", "FP8 generation with importance-sampling correction",
           "vllm_cfg.precision=fp8 needs loss_fn.use_importance_sampling_correction=true", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {GRPO}:1321-1324 (also ppo.py:855-858): assert 'Importance sampling must be enabled for "
                  "vLLM FP8 generation'",
           why="NeMo RL refuses to start FP8 generation without the correction: FP8 samples are off-policy for the "
               "learner. Set loss_fn.use_importance_sampling_correction=true.")
def n1_is(ctx: CheckContext):
    j = ctx.job
    k = "loss_fn.use_importance_sampling_correction"
    if _fp8_gen(j) and not j.value(k):
        return [finding("N1", k, j.value(k), "FP8 generation without importance-sampling correction: NeMo RL asserts",
                        f"set {k}=true")]
    return []


@invariant("N2", "job", "a KV-cache dtype NeMo RL takes",
           "vllm_cfg.kv_cache_dtype is auto, fp8 or fp8_e4m3, and an fp8 KV cache comes with precision=fp8",
           needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {FP8}:196-209 (init_fp8 ValueErrors); {GRPO}:1325-1330 (assert)",
           why="NeMo RL's FP8 KV cache exists only with FP8 weights (it patches vLLM's FP8 path) and rejects other "
               "dtypes. Use kv_cache_dtype=fp8 with precision=fp8, or auto.")
def n2_kv(ctx: CheckContext):
    j, out = ctx.job, []
    kv = j.fact("kv_cache_dtype")
    if kv.value is not None and kv.value not in KV_OK:
        out.append(finding("N2", kv.key, kv.value, f"NeMo RL accepts kv_cache_dtype {', '.join(KV_OK)} only",
                           f"set {kv.key}=fp8 or auto"))
    elif str(kv.value).startswith("fp8") and j.value(NEMO_VLLM + "precision") != "fp8":
        out.append(finding("N2", kv.key, kv.value, "an FP8 KV cache needs FP8 weights (precision=fp8)",
                           f"set {NEMO_VLLM}precision=fp8 or {kv.key}=auto"))
    return out


@invariant("N3", "job", "what NeMo RL's FP8 KV cache needs",
           "an fp8 KV cache runs with the DTensor backend off, no async rollouts (vllm_cfg.async_engine) and Megatron "
           "pipeline_model_parallel_size=1", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {GRPO}:1332-1340 (asserts); nemo_rl/models/generation/interfaces.py:229-250 "
                  "(should_use_async_rollouts)",
           why="NeMo RL sends the trainer's KV scales with each refit only from the Megatron worker, synchronously, "
               "with one pipeline stage; it asserts each of these at startup.")
def n3_kv_needs(ctx: CheckContext):
    j, out = ctx.job, []
    if not str(j.get("kv_cache_dtype")).startswith("fp8"):
        return out
    for key, bad, why, fix in (
            ("policy.dtensor_cfg.enabled", lambda v: v is not False, "the DTensor backend is not supported with an "
             "FP8 KV cache", "false"),
            (NEMO_VLLM + "async_engine", lambda v: bool(v), "async rollouts are not supported with an FP8 KV cache",
             "false"),
            (NEMO_MEGATRON + "pipeline_model_parallel_size", lambda v: (v or 1) != 1, "an FP8 KV cache needs "
             "Megatron pipeline_model_parallel_size=1", "1")):
        if bad(j.value(key)):
            out.append(finding("N3", key, j.value(key), why + f" ({j.origin.get(key, 'not written')})",
                               f"set {key}={fix}"))
    return out


@invariant("N4", "job", "MXFP8 generation needs FP8 precision and power-of-two scales",
           "vllm_cfg.is_mx=true comes with precision=fp8 and neither pow2_*_scaling_factors set to false",
           needs=NEEDS, stacks=NEMO_RL, live=False, source=f"NeMo RL {FP8}:192-194, 222-229 (init_fp8 ValueErrors)",
           why="MXFP8 scales are E8M0 (powers of two) by definition; NeMo RL raises on an explicit false and on is_mx "
               "without FP8 weights. Set precision=fp8 and leave the pow2 switches unset or true.")
def n4_mx(ctx: CheckContext):
    j, out = ctx.job, []
    if not j.value(NEMO_VLLM + "is_mx"):
        return out
    if j.value(NEMO_VLLM + "precision") != "fp8":
        out.append(finding("N4", NEMO_VLLM + "is_mx", True, "is_mx=True requires precision='fp8' (NeMo RL raises)",
                           f"set {NEMO_VLLM}precision=fp8"))
    for name in ("pow2_weight_scaling_factors", "pow2_activation_scaling_factors"):
        k = NEMO_VLLM + name
        if j.has(k) and j.value(k) is False:
            out.append(finding("N4", k, False, "only power-of-two scaling factors are supported for MXFP8 (NeMo RL "
                               "raises)", f"remove {k} or set it true"))
    return out


@invariant("N5", "job", "`use_deep_gemm: false` does not turn DeepGEMM off",
           "with FP8 generation, use_deep_gemm=false written in the job is paired with VLLM_USE_DEEP_GEMM=0 when "
           "that is what it means to do", needs=NEEDS, stacks=NEMO_RL, live=False, severity="warning",
           source=f"NeMo RL {FP8}:240-242 (only `true` sets VLLM_USE_DEEP_GEMM=1 / E8M0=0; false sets nothing); vLLM "
                  "0.26 vllm/envs.py:1480-1487 (DeepGEMM and E8M0 default on)",
           why="use_deep_gemm: false leaves vLLM's defaults in place, and vLLM 0.26 runs DeepGEMM with E8M0 "
               "requantization by default: FP32 block scales become UE8M0 anyway (C2). Export VLLM_USE_DEEP_GEMM=0 "
               "in policy.generation.vllm_cfg.env_vars, or set use_deep_gemm: true (E8M0 pinned 0).")
def n5_deep_gemm(ctx: CheckContext):
    j = ctx.job
    k = NEMO_VLLM + "use_deep_gemm"
    dg = j.fact("env.rollout.VLLM_USE_DEEP_GEMM")
    if _fp8_gen(j) and not j.value(NEMO_VLLM + "is_mx") and j.written(k) and j.value(k) is False and dg.value == "1":
        return [finding("N5", k, False, f"use_deep_gemm: false sets nothing; DeepGEMM stays on ({dg.origin})",
                        f"add VLLM_USE_DEEP_GEMM: '0' to {NEMO_VLLM}env_vars (or use_deep_gemm: true)")]
    return []


@invariant("N6", "job", "fp8_cfg names its three keys",
           "with policy.megatron_cfg.fp8_cfg.enabled=true, the job (or its defaults chain) gives fp8, fp8_recipe and "
           "fp8_param", needs=NEEDS, stacks=NEMO_RL, live=False,
           source="NeMo RL nemo_rl/models/megatron/setup.py:1171-1178 (KeyError 'Missing key in fp8_cfg')",
           why="NeMo RL reads the three keys with [] once FP8 training is on and stops with a KeyError. Write them "
               "(the base recipe's values are e4m3, blockwise, false).")
def n6_fp8_cfg(ctx: CheckContext):
    j, out = ctx.job, []
    if not j.value(NEMO_FP8 + "enabled") or not j.value(NEMO_MEGATRON + "enabled"):
        return out
    if any(k.startswith("defaults:") for k in j.unresolved):
        return out          # the keys may come from a parent fp8check could not read (K20 says so)
    for name in ("fp8", "fp8_recipe", "fp8_param"):
        k = NEMO_FP8 + name
        if not j.written(k):
            out.append(finding("N6", k, None, f"fp8_cfg.enabled=true without {name}: NeMo RL raises KeyError",
                               f"write {k}"))
    return out


@invariant("N7", "job", "sequence-length divisor covers TP and CP",
           "with sequence packing on the Megatron backend, policy.make_sequence_length_divisible_by is a multiple of "
           "(2*CP if CP>1) * (TP if TP>1 and sequence_parallel)", needs=NEEDS, stacks=NEMO_RL, live=False,
           source="NeMo RL nemo_rl/models/megatron/data.py:1284-1295 (_get_pack_sequence_parameters_for_megatron "
                  "assert); the FP8 packed divisor (blockwise 128, mxfp8 32, other 16) is applied automatically there",
           why="Each sequence is split across the CP ranks (2*CP chunks) and, with sequence parallelism, the TP ranks; "
               "NeMo RL asserts the divisor first. The base recipe sets it to the DTensor TP size, which a Megatron "
               "recipe easily outgrows.")
def n7_divisor(ctx: CheckContext):
    j = ctx.job
    if not j.value(NEMO_MEGATRON + "enabled") or not j.value("policy.sequence_packing.enabled"):
        return []
    tp, cp = j.get("trainer_tp"), j.get("trainer_cp")
    sp = j.value(NEMO_MEGATRON + "sequence_parallel")
    factor = (cp * 2 if cp > 1 else 1) * (tp if tp > 1 and sp else 1)
    k = "policy.make_sequence_length_divisible_by"
    v = j.value(k)
    if v is not None and v % factor:
        return [finding("N7", k, v, f"not a multiple of {factor} (TP={tp}, sequence_parallel={sp}, CP={cp}): NeMo RL "
                        "asserts", f"set {k}={factor * max(1, -(-v // factor))}")]
    return []


@invariant("N8", "job", "MXFP8 MoE dims divide by 32",
           "an MXFP8 rollout of an MoE model has hidden_size and the per-partition expert intermediate size (TP-split "
           "unless expert parallel) divisible by 32", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {FP8}:919-928 (create_weights_mxfp8_moe ValueError)",
           why="MXFP8 groups 32 elements along K; NeMo RL's MoE weights refuse a partition that breaks the groups. "
               "Pick a rollout TP (or expert parallelism) that keeps the expert intermediate size per rank a "
               "multiple of 32.")
def n8_moe(ctx: CheckContext):
    j = ctx.job
    spec = ctx.config.spec
    if j.get("rollout_format") != "mxfp8" or not spec.is_moe:
        return []
    tp, ep = j.fact("rollout_tp"), j.get("rollout_ep")
    per = spec.moe_intermediate_size / (1 if ep > 1 else tp.value)
    if spec.hidden_size % 32 or per % 32:
        return [finding("N8", tp.key, tp.value, f"hidden {spec.hidden_size}, expert intermediate per partition "
                        f"{per:g}: not multiples of 32", "pick a rollout TP that keeps both multiples of 32")]
    return []


@invariant("N9", "job", "BF16 layers agree between trainer and rollout",
           "with FP8 training, vllm_cfg.num_first/last_layers_in_bf16 equal Megatron's num_layers_at_start/end_in_bf16 "
           "(with first_last_layers_bf16)", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {FP8}:261-285 (rollout ignores whole layers); Megatron-Core megatron/core/fp8_utils.py:"
                  "672-690 (is_first_last_bf16_layer)",
           why="The two counts are separate knobs in two backends; when they differ, those layers run FP8 on one side "
               "and BF16 on the other. Give megatron_cfg the same first_last_layers_bf16 / num_layers_at_*_in_bf16.")
def n9_bf16_layers(ctx: CheckContext):
    j, out = ctx.job, []
    if not j.get("fp8_training") or not j.get("rollout_format"):
        return out
    on = bool(j.value(NEMO_MEGATRON + "first_last_layers_bf16"))
    for side, rk, tk in (("first", "num_first_layers_in_bf16", "num_layers_at_start_in_bf16"),
                         ("last", "num_last_layers_in_bf16", "num_layers_at_end_in_bf16")):
        r = j.value(NEMO_VLLM + rk) or 0
        t = (j.value(NEMO_MEGATRON + tk) or 0) if on else 0
        if r != t:
            out.append(finding("N9", NEMO_VLLM + rk, r, f"the rollout keeps the {side} {r} layer(s) in BF16, the "
                               f"trainer {t}", f"set {NEMO_MEGATRON}first_last_layers_bf16=true and "
                               f"{NEMO_MEGATRON}{tk}={r} (or {rk}={t})"))
    return out


@invariant("N10", "job", "an ignore keyword selects one kind of module",
           "every quantization_ignored_layer_kws entry, matched by substring as NeMo RL does, selects modules of one "
           "kind and at least one", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {FP8}:286-300 (`any(p in n for p in kws)`); review of NeMo RL PR #3614 ('router' / "
                  "'mlp.gate.' substrings missed most router spellings)",
           why="A substring keyword like `gate` or `mlp.gate` also selects gate_proj / gate_up_proj and keeps the "
               "whole MLP in BF16; a keyword that matches nothing excludes nothing. Use a keyword that names one "
               "module kind (e.g. `mlp.gate` only where no gate_proj exists, `shared_expert_gate`).")
def n10_keywords(ctx: CheckContext):
    j, out = ctx.job, []
    if not j.get("rollout_format"):
        return out
    by_kw = j.fact("ignored_by_kw")
    for kw, mods in (by_kw.value or {}).items():
        kinds = sorted({module_kind(m) for m in mods})
        if not mods:
            out.append(finding("N10", by_kw.key, kw, f"keyword {kw!r} matches no module: it excludes nothing",
                               "fix the keyword or remove it"))
        elif len(kinds) > 1:
            out.append(finding("N10", by_kw.key, kw, f"keyword {kw!r} matches several kinds of module {kinds[:5]} "
                               "(substring match)", "use a keyword that names one kind of module"))
    return out


@invariant("N11", "job", "NeMo RL's ignored_layers cover the model's high-precision GEMMs",
           "with FP8 generation, every GEMM the model keeps in high precision (routers, shared-expert gates, GDN a/b "
           "projections) is in the rollout's ignored_layers (bf16 layers + keywords)", needs=NEEDS, stacks=NEMO_RL, live=False,
           source=f"NeMo RL {FP8}:256-303 (no router default: only num_*_layers_in_bf16 and keywords); review of NeMo "
                  "RL PR #3614",
           why="NeMo RL's FP8 config ignores only what the job lists, and vLLM's Fp8Config quantizes an MoE router "
               "unless it is ignored; Megatron's router is never an FP8 GEMM. Add a keyword for each (e.g. "
               "quantization_ignored_layer_kws: [mlp.gate] on Qwen3-MoE).")
def n11_required(ctx: CheckContext):
    j = ctx.job
    if not j.get("rollout_format"):
        return []
    ign = j.fact("rollout_ignored")
    missing = [m for m in required_high_precision(ctx.config.spec) if m not in (ign.value or [])]
    if missing:
        kinds = sorted({module_kind(m) for m in missing})
        return [finding("N11", NEMO_VLLM + "quantization_ignored_layer_kws", j.value(
            NEMO_VLLM + "quantization_ignored_layer_kws"), f"{len(missing)} GEMM(s) the model keeps in high precision "
            f"are quantized by the rollout: {kinds}", f"add {kinds} to {NEMO_VLLM}quantization_ignored_layer_kws")]
    return []


@invariant("N12", "job", "FP8 generation runs on the vLLM backend",
           "vllm_cfg.precision=fp8 goes with policy.generation.backend=vllm", needs=NEEDS, stacks=NEMO_RL, live=False,
           source="NeMo RL nemo_rl/models/generation/dynamo/config.py:58-67, 175-202 (dynamo: precision must be bf16); "
                  "no SGLang FP8 path at 7ea279ab (#3614 / #3426 open)",
           why="Only NeMo RL's vLLM backend applies vllm_cfg's FP8 settings; dynamo rejects them and the other "
               "backends ignore them. Use backend=vllm for FP8 generation.")
def n12_backend(ctx: CheckContext):
    j = ctx.job
    k = "policy.generation.backend"
    if j.value(NEMO_VLLM + "precision") == "fp8" and j.value(k) != "vllm":
        return [finding("N12", k, j.value(k), "FP8 generation settings (vllm_cfg) apply to the vLLM backend only",
                        f"set {k}=vllm")]
    return []


@invariant("N13", "job", "fp8_cfg is read by the Megatron backend only",
           "policy.megatron_cfg.fp8_cfg.enabled=true comes with policy.megatron_cfg.enabled=true", needs=NEEDS, stacks=NEMO_RL,
           live=False, severity="warning",
           source="NeMo RL nemo_rl/models/megatron/setup.py:1171-1178 (the only reader of fp8_cfg)",
           why="With the Megatron backend off, the DTensor backend trains and fp8_cfg is never read: the job trains in "
               "BF16. Set policy.megatron_cfg.enabled=true (and dtensor_cfg.enabled=false).")
def n13_megatron(ctx: CheckContext):
    j = ctx.job
    k = NEMO_FP8 + "enabled"
    if j.value(k) and not j.value(NEMO_MEGATRON + "enabled"):
        mk = NEMO_MEGATRON + "enabled"
        return [finding("N13", mk, j.value(mk), "fp8_cfg.enabled=true but the Megatron backend is off "
                        f"({j.origin.get(mk, '')}): training runs in BF16", f"set {mk}=true")]
    return []
