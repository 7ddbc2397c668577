"""Job rules any stack can break: unknown keys, the rollout's FP8 against the learner's, the recipe, unresolved
values, the model (K1, K3, K5, K6, K9, K12, K20, K21, M1, M2)."""
from __future__ import annotations

import difflib

from fp8check.harness.formats import arch_major
from fp8check.harness.jobconfig import ENV_KNOWN, FP8_PREFIXES, KNOWN, OPEN_SUBTREES
from fp8check.harness.jobconfig.keys import ENV_MAPS, ENV_PREFIXES, RENAMED, SKYRL_EIK
from fp8check.harness.jobconfig.vllm_args import SERVER_ARGS, VLLM_VERSION

from ..base import CheckContext, invariant
from .common import NEEDS, OWN, finding

CHECKED = ("blockwise", "mxfp8")
SYNC_FIX = {
    "skyrl": "set generator.inference_engine.fp8_weight_sync_mode=auto (the trainer's own codes and scales)",
    "verl": "verl has no FP8 weight sync yet (verl #6045 / #6893): train in BF16 with an FP8 rollout and "
            "importance-sampling correction, or use a stack that syncs the trainer's FP8",
    "nemo-rl": "NeMo RL re-quantizes BF16 in vLLM: train in BF16 with importance-sampling correction, or sync the "
               "trainer's FP8 with a stack that ships it as-is",
}


def _shown(j, fact):
    """The value as the user wrote it under the fact's key (the resolved one when the key is not written)."""
    return j.flat.get(fact.key, fact.value) if fact.key else fact.value


@invariant("K1", "job", "every FP8 key is understood",
           "every key (and FP8 environment variable) under an FP8-relevant prefix is one fp8check knows, and every "
           "key under SkyRL's engine_init_kwargs is an argument vLLM's server takes: a misspelled key silently "
           "changes nothing in the stack it was meant for", needs=NEEDS, live=False,
           source=f"{OWN}; NeMo RL reads its FP8 keys with .get(key, default) and never rejects an unknown one "
                  "(quantization/fp8.py:190-300; its docs once named the pow2 switches wrongly, commit ad364966 / #2536); "
                  "SkyRL 0.4.0 sets every engine_init_kwargs key on vLLM's argument namespace "
                  "(skyrl/backends/skyrl_train/inference_servers/utils.py:282-289), where vLLM 0.26.0 reads only its "
                  "own argument names (harness/jobconfig/vllm_args.py)",
           why="A typo under an FP8 prefix (fp8_recipie, use_weight_pow2_scale, NVTE_FP8_BLOCK_SCALING_FP32_SCALE) is "
               "read by nobody: the run trains with the default you meant to change. Fix the spelling to the key "
               "fp8check suggests, or remove the key.")
def k1_unknown_keys(ctx: CheckContext):
    j, out = ctx.job, []
    for k in list(j.flat):
        if k in KNOWN or any(k.startswith(p) for p in OPEN_SUBTREES) or not any(k.startswith(p) for p in FP8_PREFIXES):
            continue
        if not j.written(k):
            continue
        v = j.value(k)
        near = RENAMED.get(k) or next(iter(difflib.get_close_matches(k, sorted(KNOWN), n=1, cutoff=0.8)), None)
        out.append(finding("K1", k, v, "unknown key under an FP8-relevant prefix: no stack reads it, so it changes "
                           "nothing", f"did you mean {near}?" if near else "remove it or report it to fp8check"))
    out += _engine_init_kwargs(j, {f.evidence.get("key") for f in out})
    names = {n: (n, "environment") for n in j.env}
    for prefix in ENV_MAPS:
        names.update({k[len(prefix):]: (k, "job") for k in j.flat if k.startswith(prefix)})
    for name, (key, _) in sorted(names.items()):
        if name.startswith(ENV_PREFIXES) and name not in ENV_KNOWN:
            near = next(iter(difflib.get_close_matches(name, ENV_KNOWN, n=1, cutoff=0.8)), None)
            out.append(finding("K1", key, j.getenv(name) if key == name else j.value(key), "unknown FP8 environment variable: "
                               "neither Transformer Engine 2.20.2 nor vLLM 0.26 reads it",
                               f"did you mean {near}?" if near else "remove it"))
    return out


def _engine_init_kwargs(j, reported: set) -> list:
    """K1 under SkyRL's engine_init_kwargs: each top-level name against the arguments vLLM's server takes (a
    nested mapping such as hf_overrides is judged by its first name); a key the FP8-prefix check reported already
    is not reported twice."""
    if j.stack != "skyrl":
        return []
    out, seen = [], set()
    for k in list(j.flat):
        if not k.startswith(SKYRL_EIK) or not j.written(k):
            continue
        name = k[len(SKYRL_EIK):].split(".", 1)[0]
        if name in SERVER_ARGS or name in seen or k in reported:
            continue
        seen.add(name)
        near = next(iter(difflib.get_close_matches(name, sorted(SERVER_ARGS), n=1, cutoff=0.75)), None)
        out.append(finding("K1", SKYRL_EIK + name, j.value(k) if k == SKYRL_EIK + name else "{...}",
                           f"not an argument of vLLM {VLLM_VERSION}'s engine or server: SkyRL sets it on vLLM's "
                           "argument namespace, where nothing reads it",
                           f"did you mean {SKYRL_EIK}{near}?" if near else "remove it"))
    return out


@invariant("K3", "job", "rollout FP8 format = trainer recipe",
           "when both sides run FP8, the rollout's FP8 format (SkyRL's wire, NeMo RL's is_mx, verl's blockwise) is the "
           "trainer's recipe (blockwise with blockwise, mxfp8 with mxfp8)", needs=NEEDS, live=False,
           source=f"{OWN}; SkyRL accepts an explicit mismatch (only `auto` follows the recipe, quantization_utils.py:"
                  "153-177; its Blackwell example run_fp8_blackwell_mxfp8_qwen35_9b.sh ships a blockwise wire on an mxfp8 "
                  "trainer); NeMo RL checks neither (#3477 rejects only blockwise storage -> MXFP8 reshard)",
           why="A blockwise rollout of an MXFP8 learner (or the reverse) samples codes on another grid with other "
               "scales: the policy the sampler runs is not the one the learner trains, by construction. Make the two "
               "formats equal (SkyRL: fp8_weight_sync_mode=auto).")
def k3_format_recipe(ctx: CheckContext):
    j = ctx.job
    fmt, rec = j.fact("rollout_format"), j.get("recipe")
    if j.get("fp8_training") and fmt.value in CHECKED and rec in CHECKED and fmt.value != rec:
        fix = {"skyrl": f"set {fmt.key}={rec} (or auto)",
               "nemo-rl": f"set policy.generation.vllm_cfg.is_mx={'true' if rec == 'mxfp8' else 'false'}",
               "verl": "verl's FP8 rollout is blockwise only: train with fp8_recipe=blockwise"}.get(j.stack, "")
        return [finding("K3", fmt.key, _shown(j, fmt), f"the rollout serves {fmt.value} FP8 while the trainer's recipe is "
                        f"{rec}: the sampler runs another quantization than the learner", fix)]
    return []


# What a corrected off-policy rollout should expect, from the published measurements (issue 22's sources)
EXPECTED_MISMATCH = ("expect a train-rollout mismatch above an on-policy FP8 sync's (SkyRL measured 0.02-0.03 mean "
                     "|dlogprob| on-policy, an independently quantizing engine passing 0.05; NeMo RL suspects a "
                     "broken refit above gen_kl_error 0.004): watch it, and the clip fraction, from the first step")


def _off_policy(j, rule: str, what: str, fix: str):
    """K5 / K6: a sampler off the learner's numerics by construction. An error without the stack's
    importance-sampling correction; with it on, a warning that names the mismatch to expect."""
    fmt = j.fact("rollout_format")
    if j.get("is_correction"):
        return [finding(rule, fmt.key, _shown(j, fmt), f"{what}; the importance-sampling correction is on: "
                        f"{EXPECTED_MISMATCH}", fix, severity="warning")]
    key = j.fact("is_correction").key
    return [finding(rule, fmt.key, _shown(j, fmt), f"{what}, and no importance-sampling correction: the policy "
                    f"gradient is biased by the quantization error", (f"turn on {key}; or " if key else "") + fix)]


@invariant("K5", "job", "an FP8 learner syncs FP8",
           "FP8 training with an FP8 rollout syncs the trainer's own FP8 codes and scales, never BF16 for the engine "
           "to re-quantize (an error; a warning naming the mismatch to expect when the stack's importance-sampling "
           "correction is on)", needs=NEEDS, live=False,
           source=f"{OWN}; verl's FP8 E2E re-quantizes BF16 exports in the rollout worker (verl #3633; "
                  "vllm_quant_utils.py quant_weights), NeMo RL in the vLLM worker (quantization/fp8.py load_weights)",
           why="An engine that re-quantizes the BF16 weights computes its own codes and scales (another formula, "
               "another rounding, E3): it samples a policy the learner never held, and S2 fails on the first sync. "
               "Sync the trainer's own FP8 (SkyRL: fp8_weight_sync_mode); where the stack cannot, its importance-"
               "sampling correction (NeMo RL's validated end-to-end FP8 setup) bounds the bias, and K5 says what "
               "mismatch to expect.")
def k5_naive(ctx: CheckContext):
    j = ctx.job
    if j.get("fp8_training") and j.fact("rollout_format").value and j.get("sync") == "naive":
        return _off_policy(j, "K5", "FP8 training with a BF16 weight sync: the engine re-quantizes with its own "
                           "scales and samples a policy the learner never held (S2)",
                           SYNC_FIX.get(j.stack, "sync the trainer's own FP8 codes and scales"))
    return []


@invariant("K6", "job", "an FP8 rollout of a BF16 learner needs a correction",
           "an FP8 rollout engine sampling for a BF16 learner runs another policy by construction: an error without "
           "the stack's importance-sampling correction, a warning naming the mismatch to expect with it",
           needs=NEEDS, live=False,
           source=f"{OWN}; verl docs/low_precision/fp8.md (FP8 rollout without token-level TIS drops accuracy); "
                  "NeMo RL asserts it for FP8 generation (grpo.py:1321-1324, rule N1)",
           why="An FP8 sampler of a BF16 learner is off-policy by construction, exactly as an FP8 learner whose engine "
               "re-quantizes BF16 (K5); without an importance-sampling correction the policy gradient is biased by "
               "the quantization error. Turn on the correction (SkyRL "
               "trainer.algorithm.off_policy_correction.tis_ratio_type=token, verl "
               "algorithm.rollout_correction.rollout_is=token, NeMo RL loss_fn.use_importance_sampling_correction).")
def k6_bf16_learner(ctx: CheckContext):
    j = ctx.job
    if j.fact("rollout_format").value and not j.get("fp8_training"):
        return _off_policy(j, "K6", "FP8 rollout of a BF16 learner: off-policy by construction",
                           "train in FP8 with a stack that syncs the trainer's own FP8")
    return []


@invariant("K22", "job", "an FP8 learner's BF16 sampler is off its grid",
           "an FP8 learner whose rollout engine serves BF16 samples another policy than the one it trains (a warning "
           "naming the mismatch to expect; an FP8 sync keeps the sampler on the learner's grid)",
           needs=NEEDS, live=False, severity="warning",
           source=f"{OWN}; the MXFP8 paper 2610.34915 (a sampler on the learner's grid: train-rollout KL 11-16 % "
                  "lower than a BF16 sampler's; fp8check e2e arm bf16-sampler)",
           why="A BF16 sampler is higher precision, not closer: the learner's forward runs FP8 codes, the sampler the "
               "BF16 parameters, so every token's log-prob differs by the learner's quantization error. Sync the "
               "learner's FP8 into an FP8 engine (SkyRL fp8_weight_sync_mode), or expect that mismatch.")
def k22_bf16_sampler(ctx: CheckContext):
    j = ctx.job
    if j.get("fp8_training") and not j.fact("rollout_format").value:
        key = j.fact("rollout_format").key or "the rollout's quantization (unset)"
        return [finding("K22", key, None, "FP8 training with a BF16 rollout engine: the sampler is off the "
                        "learner's FP8 grid (expect the mismatch of the e2e arm bf16-sampler)",
                        "serve the learner's FP8: an FP8 rollout with an FP8 weight sync")]
    return []


@invariant("K9", "job", "the reference model runs the learner's numerics",
           "the reference policy's fp8 / fp8_recipe / fp8_param equal the policy's (KL terms compare like with like)",
           needs=NEEDS, live=False, severity="warning", source=OWN,
           why="A KL penalty between an FP8 policy and a BF16 (or other-recipe) reference measures the quantization "
               "difference, not the policy change. Give trainer.ref the policy's FP8 settings.")
def k9_reference(ctx: CheckContext):
    j, out = ctx.job, []
    mine = {"fp8": j.get("fp8_format"), "fp8_recipe": j.get("recipe"), "fp8_param": j.get("fp8_param")}
    for name in ("fp8", "fp8_recipe", "fp8_param"):
        f = j.fact(f"ref.{name}")
        if f.key is None:
            continue
        v = f.value
        if name == "fp8" and isinstance(v, str) and v.strip().lower() in ("", "0", "false", "none", "null", "no", "off"):
            v = None
        if v != mine[name] and not (name == "fp8_recipe" and v in ("auto", mine[name])):
            out.append(finding("K9", f.key, f.value, f"the reference model's {name} differs from the policy's "
                               f"({mine[name]}): KL terms compare different numerics", f"set it to {mine[name]}"))
    return out


@invariant("K12", "job", "blockwise on Blackwell is emulated",
           "an explicit fp8_recipe=blockwise on sm100+ runs TE's emulation on the MX datapath (power-of-two scales): "
           "prefer mxfp8 (or auto)", needs=NEEDS, live=False, severity="warning",
           source="SkyRL skyrl/backends/skyrl_train/distributed/megatron/quantization_utils.py:56-66 "
                  "(resolve_auto_fp8_recipe warns)",
           why="Transformer Engine emulates Float8BlockScaling on Blackwell with power-of-two scales; MoE experts that "
               "receive no tokens then emit amax==0 gradient blocks whose degenerate scales overflow the grad norm "
               "(SkyRL's comment). Use fp8_recipe=mxfp8 or auto on sm100+.")
def k12_blockwise_blackwell(ctx: CheckContext):
    j = ctx.job
    w = j.fact("recipe_written")
    arch = j.get("gpu")
    if j.get("fp8_training") and w.value == "blockwise" and (arch_major(arch) or 9) >= 10:
        return [finding("K12", w.key, w.value, f"blockwise recipe on {arch}: emulated on the MX datapath",
                        f"set {w.key}=mxfp8 (or auto)")]
    return []


@invariant("K20", "job", "every value fp8check reads is resolved",
           "no value a rule reads comes from a `defaults:` parent that is not here or a `${...}` it cannot evaluate "
           "offline", needs=NEEDS, live=False, severity="warning",
           source=f"{OWN}; NeMo RL nemo_rl/utils/config.py load_config_with_inheritance (defaults chain), OmegaConf "
                  "interpolation and resolvers",
           why="A value inherited from a file fp8check cannot read, or computed by a resolver it does not evaluate, "
               "is judged at the stack's base default instead: the verdict may not be the run's. Put the parent next "
               "to the job, or write the value (or pass --set KEY=VALUE).")
def k20_unresolved(ctx: CheckContext):
    j = ctx.job
    return [finding("K20", k, None, f"not resolved: {why}", "write the value into the job or pass --set KEY=VALUE")
            for k, why in sorted(j.unresolved.items())]


@invariant("K21", "job", "the trainer's recipe is one the FP8 sync carries",
           "FP8 training names fp8_recipe blockwise, mxfp8 or auto: Megatron-Core's default (delayed) and tensorwise / "
           "custom are per-tensor recipes no stack's FP8 rollout serves (fp8check models delayed scaling on CPU only: the "
           "e2e arm naive-fp8)",
           needs=NEEDS, live=False,
           source="Megatron-Core megatron/core/transformer/transformer_config.py:573 (fp8_recipe defaults to "
                  "'delayed'); SkyRL and verl pass fp8 through without a recipe check",
           why="fp8: e4m3 without fp8_recipe trains with delayed (per-tensor) scaling, while every FP8 rollout here "
               "is blockwise or MXFP8: the learner and the sampler quantize differently, silently. Write "
               "fp8_recipe=blockwise (Hopper), mxfp8 (Blackwell) or auto.")
def k21_recipe(ctx: CheckContext):
    j = ctx.job
    rec = j.fact("recipe")
    if j.get("fp8_training") and rec.value not in CHECKED:
        key = rec.key
        return [finding("K21", key, rec.value, f"fp8_recipe={rec.value} ({rec.origin}): a per-tensor recipe; the FP8 "
                        "rollout and fp8check's checks are blockwise / MXFP8", f"set {key}=blockwise (or auto)")]
    return []


@invariant("M1", "job", "the model's dims are known",
           "the job's model is a tiny model name or a local checkpoint with a config.json, so its shape, alignment and "
           "exclusion rules run on its real dims", needs=NEEDS, live=False, severity="warning", source=OWN,
           why="Without the model's dims, the alignment (A*) and exclusion (X*) rules run on tiny-dense and prove "
               "nothing about your model. Point the model path at a local checkpoint directory (config.json is enough).")
def m1_model(ctx: CheckContext):
    j = ctx.job
    if not j.get("model_known"):
        m = j.fact("model")
        return [finding("M1", m.key, m.value, "model dims unknown here (not a tiny model name nor a local path "
                        "with config.json): shape, alignment and exclusion rules use tiny-dense",
                        "point the model path at a local checkpoint directory to check its dims")]
    return []


@invariant("M2", "job", "FP8 KV cache and linear attention",
           "an FP8 KV cache is not combined with gated delta-net (linear attention) layers on the FP8 sync path",
           needs=NEEDS, live=False, severity="warning",
           source="vLLM 0.26 v1/worker/gpu_model_runner.py init_fp8_kv_scales assumes flat KV tensors (hybrid caches "
                  "are lists: 'list' object has no attribute 'zero_'); SkyRL patches it "
                  "(patches/vllm/patch_hybrid_fp8_kv_wake.py, #2053)",
           why="vLLM 0.26 resets FP8 KV scales after a wake by zeroing flat KV tensors; a hybrid model's cache is a "
               "list per layer and the reset raises (or, patched, is skipped for the linear-attention state). Keep "
               "kv_cache_dtype=auto for hybrid models unless your stack carries the patch.")
def m2_kv_linear(ctx: CheckContext):
    j = ctx.job
    kv = j.fact("kv_cache_dtype")
    if kv.value and "fp8" in str(kv.value) and any(t != "full_attention" for t in ctx.config.spec.layer_types):
        return [finding("M2", kv.key, kv.value, "FP8 KV cache with linear-attention layers is not supported by the "
                        "FP8 sync path yet", "leave kv_cache_dtype=auto")]
    return []
