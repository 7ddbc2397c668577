"""Mistakes the stacks let through, from their trackers, code reviews and source (E1-E8): a GPU-less driver's
Hopper defaults, environment variables read at import or by nobody, quantizer formulas that cannot agree, FP8
KV-cache scales, a prefix cache kept across syncs, MXFP8 persistent parameters without communication overlap."""
from __future__ import annotations

from fp8check.harness.jobconfig.keys import ENV_MAPS, SKYRL_EIK, TE_IMPORT_TIME, VERL_RUNTIME_ENV
from fp8check.harness.jobconfig.stacks import overlap_keys

from ..base import CheckContext, invariant
from .common import NEEDS, SKYRL, finding

TRUTHY = ("1", "true", "yes")     # verl/utils/kernel/fp8_kernel.py:33


@invariant("E1", "job", "a GPU-less driver does not pick the workers' defaults",
           "when no --gpu is given and no GPU is visible, nothing FP8 in the job depends on a guessed architecture",
           needs=NEEDS, live=False,
           source="SkyRL PR #1898 review (cursor[bot] 'CPU driver forces Hopper FP8 scales', on "
                  "skyrl/train/utils/utils.py:1006; 'Driver resolves auto FP8 recipe', fixed by b309f780; 'Unresolved "
                  "auto recipe misaligns SFT packing', packing_utils.py:19); SkyRL 0.4.0 refuses the GPU-less driver "
                  "without the variable (skyrl/train/utils/utils.py:1097-1109, rule K26)",
           why="A stack's driver that picks NVTE_FP8_BLOCK_SCALING_FP32_SCALES (and the E8M0 pin) from its own GPU "
               "exports Hopper's FP32 scales to Blackwell workers when it has none (SkyRL's PR did; 0.4.0 refuses "
               "instead, K26); an unresolved fp8_recipe=auto pads SFT packing for blockwise while the workers resolve "
               "mxfp8. fp8check, like such a driver, would judge Hopper. Pass --gpu for the workers' GPU and pin "
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES, fp8_recipe and the wire explicitly.")
def e1_gpuless(ctx: CheckContext):
    j = ctx.job
    if not j.get("gpu_assumed") or not (j.get("fp8_training") or j.get("rollout_format")):
        return []
    guessed = []
    rec = j.fact("recipe")
    if j.get("recipe_written") in ("auto", None) and j.get("fp8_training"):
        guessed.append(f"{rec.key or 'fp8_recipe'} -> {rec.value}")
    e = j.fact("env.trainer.NVTE_FP8_BLOCK_SCALING_FP32_SCALES")
    if e.key == "NVTE_FP8_BLOCK_SCALING_FP32_SCALES" and "default" in e.origin:
        guessed.append(f"NVTE_FP8_BLOCK_SCALING_FP32_SCALES -> {e.value} ({e.origin})")
    guessed.append("every arch rule (C3, C5, K12, K14) judged for sm90")
    return [finding("E1", "--gpu", "auto (no GPU visible)", "no GPU visible: " + "; ".join(guessed),
                    "pass --gpu sm90|sm100 for the workers' GPU and set NVTE_FP8_BLOCK_SCALING_FP32_SCALES and "
                    "fp8_recipe explicitly")]


@invariant("E2", "job", "one value for each variable TE reads at import",
           "a variable Transformer Engine reads at import (NVTE_FP8_BLOCK_SCALING_FP32_SCALES, NVTE_BACKWARD_OVERRIDE) "
           "is not given different values by the job's worker env and the driver's environment", needs=NEEDS,
           live=False, severity="warning",
           source="Transformer Engine 2.20.2 transformer_engine/common/recipe/__init__.py:429-443 (Float8BlockScaling's "
                  "class attributes read the variable once, at import); NeMo RL nemo_rl/distributed/worker_groups.py:"
                  "452-455 (the job's env_vars win over the driver's); verl ray_kwargs.ray_init.runtime_env",
           why="TE freezes these variables into Float8BlockScaling's defaults when it is imported: only the value in a "
               "worker's launch environment counts, and changing os.environ in a running process (an actor's "
               "__init__, a notebook cell after `import transformer_engine`) changes nothing. When the job's env map "
               "and the driver's shell disagree, the trainer imports TE with the job's value and anything started "
               "from the driver's environment with the other. Set the variable in one place.")
def e2_import_time(ctx: CheckContext):
    j, out = ctx.job, []
    for prefix, who in ENV_MAPS.items():
        if who == "rollout":
            continue
        for var in TE_IMPORT_TIME:
            k = prefix + var
            if not j.has(k) or j.value(k) is None:
                continue
            mine, drv = str(j.value(k)), j.getenv(var)
            if drv not in (None, "") and drv != mine:
                out.append(finding("E2", k, mine, f"the trainer imports TE with {var}={mine} (the job's env map wins); "
                                   f"the driver's environment ({j.env_origin.get(var, 'environment')}) has {drv}",
                                   f"set {var} in one place (remove it from the driver's environment or from {k})"))
    return out


@invariant("E3", "job", "one quantizer formula",
           "the FP8 the rollout serves comes from one quantizer formula, the trainer's: no sender re-quantizes with "
           "scale_inv = amax/448, no stack picks between two formulas at import", needs=NEEDS, live=False,
           severity="warning",
           source="SkyRL 0.4.0 skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py:85-89 (the wire re-quantizes the BF16 "
                  "export: scale_inv = amax/448, codes x / scale_inv) vs TE's compute_scale_from_amax (scale = 448/amax, "
                  "codes x * scale); verl verl/utils/kernel/fp8_kernel.py:94-108 (Triton: amax/448) vs :280-299 "
                  "(PyTorch fallback: 448/amax), chosen at :336-341 by Triton's import and VERL_DISABLE_TRITON_FP8",
           why="amax/448 and 1/(448/amax) are different fp32 roundings, so the scales of about half the blocks and a "
               "few E4M3 codes in ten thousand differ (measured on random BF16 weights; 167 to 1647 codes per tensor "
               "against TE on the H200): a sender that re-quantizes can never give the trainer's bytes, "
               "and a stack with two kernels gives two rollouts depending on what imports. SkyRL: nothing to set "
               "(the S2 / S3 checks of a live sync measure it). verl: set VERL_DISABLE_TRITON_FP8=1 (the PyTorch "
               "path is TE's formula) on every rollout worker.")
def e3_formulas(ctx: CheckContext):
    j = ctx.job
    if j.stack == "skyrl" and j.get("wire") == "blockwise":
        w = j.fact("wire")
        return [finding("E3", w.key, w.value, "SkyRL's blockwise wire re-quantizes the BF16 export with "
                        "scale_inv = amax/448 and codes x/scale_inv; Transformer Engine computes scale = 448/amax and "
                        "x*scale: in FP32-scale mode over a third of the block scales differ by an ulp and up to about one "
                        "code in a thousand by one E4M3 step (examples/skyrl_fp8_sync counts them)",
                        "nothing to set in SkyRL: measure it with `fp8check live` (S2/S3), or sync TE's own codes")]
    if j.stack == "verl" and j.get("engine_quantization") == "fp8":
        k = VERL_RUNTIME_ENV + "VERL_DISABLE_TRITON_FP8"
        v = j.value(k) if j.has(k) else j.getenv("VERL_DISABLE_TRITON_FP8")
        if str(v or "0").lower() not in TRUTHY:
            return [finding("E3", "VERL_DISABLE_TRITON_FP8", v, "verl's rollout quantizer is the Triton kernel "
                            "(amax/448) where Triton imports, the PyTorch one (448/amax) elsewhere: two formulas, two "
                            "sets of bytes", "export VERL_DISABLE_TRITON_FP8=1 to every rollout worker")]
    return []


@invariant("E4", "job", "an FP8 KV cache the engine can run",
           "an fp8 KV cache is not fp8_e5m2 with a quantization=fp8 engine, and verl does not get one at all "
           "(no scale handling after a refit)", needs=NEEDS, live=False,
           source="vLLM 0.26 model_executor/layers/attention/attention.py:199-214 ('fp8_e5m2 kv-cache is not supported "
                  "with fp8 checkpoints'); verl: no KV-scale code at 1dda039b (FP8 KV is open PR verl #4435: scales are "
                  "computed only in the first forward)",
           why="vLLM refuses e5m2 KV with Fp8Config at engine start. In verl, engine_kwargs.vllm.kv_cache_dtype=fp8 "
               "passes straight to vLLM: the scales come from the dummy boot (vLLM 0.26 dummy_loader.py:37-44 fills "
               "q/k/v/prob_scale with one random value in (-1e-3, 1e-3)) and no refit ever repairs them "
               "(reload/layerwise.py:293-307). Use kv_cache_dtype=auto.")
def e4_kv(ctx: CheckContext):
    j = ctx.job
    kv = j.fact("kv_cache_dtype")
    if kv.value == "fp8_e5m2" and j.get("engine_quantization") == "fp8":
        return [finding("E4", kv.key, kv.value, "vLLM raises: fp8_e5m2 KV cache with an fp8 checkpoint config",
                        f"set {kv.key}=fp8_e4m3 or auto")]
    if j.stack == "verl" and str(kv.value).startswith("fp8"):
        return [finding("E4", kv.key, kv.value, "verl has no FP8 KV-scale handling: scales stay the dummy boot's "
                        "(or 1.0) through every refit", f"set {kv.key}=auto")]
    return []


@invariant("E5", "job", "the prefix cache does not outlive a weight sync",
           "prefix caching (on by default in vLLM 0.26) is reset after every weight sync: SkyRL's fully-async mode "
           "keeps it unless clear_kv_cache_on_weight_sync", needs=NEEDS, stacks=SKYRL, live=False, severity="warning",
           source="vLLM 0.26 config/cache.py:93 (enable_prefix_caching=True; reload_weights does not reset it); SkyRL "
                  "0.4.0 skyrl/backends/skyrl_train/workers/worker.py:595-604 (resets only when not fully async, or "
                  "with trainer.fully_async.clear_kv_cache_on_weight_sync)",
           why="A prefix-cache hit after a sync reuses keys and values the old weights computed: the first tokens of "
               "the new policy's samples are the old policy's. Set trainer.fully_async.clear_kv_cache_on_weight_sync="
               "true (or generator.inference_engine.enable_prefix_caching=false).")
def e5_prefix_cache(ctx: CheckContext):
    j = ctx.job
    k = "trainer.fully_async.clear_kv_cache_on_weight_sync"
    if j.value("trainer.fully_async.enabled") and j.value("generator.inference_engine.enable_prefix_caching") and \
            not j.value(k):
        return [finding("E5", k, j.value(k), "fully-async SkyRL keeps the prefix cache across weight syncs: cached "
                        "K/V from the old weights serve the new policy", f"set {k}=true")]
    return []


@invariant("E6", "job", "MXFP8 persistent parameters need communication overlap",
           "mxfp8 with fp8_param trains with overlap_grad_reduce and overlap_param_gather on", needs=NEEDS, live=False,
           source="Megatron-LM issue #2272 (NaN with reuse_grad_buf_for_mxfp8_param_ag and no DP comm overlap; fixed "
                  "in Megatron-LM PR #4769); NeMo RL nemo_rl/models/megatron/setup.py:1376-1387, 1440-1441 (derives "
                  "reuse_grad_buf_for_mxfp8_param_ag from mxfp8 + fp8_param whatever the overlap flags)",
           why="NeMo RL turns on reuse_grad_buf_for_mxfp8_param_ag for mxfp8 + fp8_param; without overlapped gradient "
               "reduce and parameter gather that path produces NaN on Megatron-LM before #4769. SkyRL refuses the "
               "combination outright (C4). Turn both overlap flags on (on a Megatron-LM with #4769), or fp8_param=false.")
def e6_overlap(ctx: CheckContext):
    j, out = ctx.job, []
    keys = overlap_keys(j.stack)
    if not keys or not (j.get("fp8_training") and j.get("recipe") == "mxfp8" and j.get("fp8_param")):
        return out
    for k in keys:
        if not j.value(k):
            out.append(finding("E6", k, j.value(k), "mxfp8 + fp8_param without this overlap: NaN (Megatron-LM #2272)",
                               f"set {k}=true (or fp8_param=false)"))
    return out


@invariant("E7", "job", "no FP8 variable that nobody reads",
           "NVTE_FP8_BLOCK_AMAX_EPSILON is not relied on: neither Transformer Engine 2.20.2 nor SkyRL's serializer "
           "reads it", needs=NEEDS, live=False, severity="warning",
           source="Transformer Engine 2.20.2 common/recipe/__init__.py:431-434 (Float8BlockScaling hard-codes "
                  "amax_epsilon=0.0); SkyRL PR #1898 review (cursor[bot] 'Rollout FP8 amax floor ignored'); SkyRL "
                  "0.4.0 skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py:85 clamps at 1e-10 (on SkyRL jobs K2 "
                  "reports the variable with SkyRL's other pre-release names)",
           why="SkyRL's PR docs export NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4, but stock TE never reads it and SkyRL's "
               "serializer clamps amax at 1e-10: the floor you set is in effect nowhere. Remove it, or set the floor "
               "through the recipe (fp8check.amax_epsilon models one).")
def e7_amax_epsilon(ctx: CheckContext):
    j, out = ctx.job, []
    var = "NVTE_FP8_BLOCK_AMAX_EPSILON"
    if j.stack == "skyrl":
        return out              # K2 names it, in one message with SkyRL's other pre-release names and their versions
    if j.getenv(var) not in (None, ""):
        out.append(finding("E7", var, j.getenv(var), f"{var} is read by nothing (TE 2.20.2 hard-codes amax_epsilon=0)",
                           f"remove {var}"))
    for prefix in ENV_MAPS:
        if j.has(prefix + var):
            out.append(finding("E7", prefix + var, j.value(prefix + var), f"{var} is read by nothing", "remove it"))
    return out


@invariant("E8", "job", "SkyRL's FP8 KV cache runs uncalibrated scales",
           "an fp8 KV cache under SkyRL's FP8 weight sync (dummy boot) gets its q/k/v scales from nowhere calibrated",
           needs=NEEDS, stacks=SKYRL, live=False, severity="warning",
           source="SkyRL PR #2072 review (cursor[bot] 'KV scale reset hits every engine', new_inference_worker_wrap.py:58, "
                  "vllm_compat.py:152-204: scales forced to 1.0 at boot, wake and every sync, in every engine); vLLM "
                  "0.26 dummy_loader.py:37-44 + model_loader/weight_utils.py:1364-1373 (dummy-filled KV scales)",
           why="With load_format=dummy (forced by SkyRL's FP8 sync) the KV scales start as one random value in "
               "(-1e-3, 1e-3), so K/V are scaled by ~1e4 and saturate, unless the stack resets them; SkyRL #2072 resets "
               "them to 1.0 everywhere (uncalibrated), #1898 alone does not. Keep kv_cache_dtype=auto unless you carry "
               "#2072's normalisation and accept scale 1.0.")
def e8_kv_skyrl(ctx: CheckContext):
    j = ctx.job
    kv = j.fact("kv_cache_dtype")
    if j.get("wire") and str(kv.value).startswith("fp8"):
        return [finding("E8", kv.key, kv.value, "FP8 KV cache in a dummy-booted engine: scales are 1.0 (SkyRL #2072) "
                        "or the dummy loader's random values (without it), never calibrated",
                        f"set {SKYRL_EIK}kv_cache_dtype=auto")]
    return []

