"""The checks verl runs on its FP8 rollout config, and the ones its docs require but its code never runs
(verl-project/verl at 1dda039b): V1-V4. Paths are relative to verl's repository."""
from __future__ import annotations

from fp8check.harness.jobconfig.keys import VERL_ROLLOUT, VERL_VLLM_KWARGS
from fp8check.harness.jobconfig.stacks import required_high_precision, verl_ignored

from ..base import CheckContext, invariant, unknown
from .common import NEEDS, VERL, finding

SERVER = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"
QUANT = {"vllm": ("fp8", "torchao", "ascend"), "sglang": ("fp8",), "trtllm": ("fp8",)}


@invariant("V1", "job", "a rollout quantization verl supports",
           "actor_rollout_ref.rollout.quantization is fp8, torchao or ascend for vLLM and fp8 for SGLang / TRT-LLM",
           needs=NEEDS, stacks=VERL, live=False,
           source=f"verl {SERVER}:1065-1069 (_apply_quantization); verl/workers/rollout/sglang_rollout/"
                  "async_sglang_server.py:302-312; verl/workers/rollout/trtllm_rollout/trtllm_async_server.py:207-220",
           why="verl raises at server launch, after the trainer has started, for any other value (the RolloutConfig "
               "dataclass does not validate it). Use quantization=fp8.")
def v1_quantization(ctx: CheckContext):
    j = ctx.job
    q, eng = j.fact("engine_quantization"), j.get("rollout_engine")
    ok = QUANT.get(eng, QUANT["vllm"])
    if q.value is not None and q.value not in ok:
        return [finding("V1", q.key, q.value, f"verl's {eng} rollout supports quantization {', '.join(ok)} only "
                        "(raises at server launch)", f"set {q.key}=fp8")]
    return []


@invariant("V2", "job", "verl's injected ignored_layers cover the model's high-precision GEMMs",
           "every GEMM the model keeps in high precision (routers, shared-expert gates, GDN a/b projections) is in the "
           "ignored_layers verl injects: `model.layers.N.mlp.gate` for every layer on vLLM (matched exactly by its Fp8Config), "
           "none on TRT-LLM",
           needs=NEEDS, stacks=VERL, live=False,
           source=f"verl {SERVER}:1071-1088 (the router exclusion for every layer); verl/workers/rollout/trtllm_rollout/"
                  "trtllm_async_server.py:207-220 (no ignored_layers); vLLM 0.26 model_executor/layers/"
                  "quantization/utils/quant_utils.py:510-560 (is_layer_skipped, exact match for Fp8Config); review of "
                  "verl PR #7519 (ModelOpt's substring match makes mlp.gate swallow mlp.gate_up_proj; opt-in exact "
                  "matcher #7918)",
           why="verl's list names only routers under `model.layers.N.`: any other module the model must keep in BF16 "
               "(a shared-expert gate, GDN in_proj_a/b, a multimodal model's `model.language_model.layers...`) is "
               "quantized by the rollout, or fails to load. On vLLM's ModelOpt path the same names match by "
               "substring and also swallow gate_up_proj. Keep such models on a BF16 rollout until verl lets you extend "
               "the list.")
def v2_ignored(ctx: CheckContext):
    j = ctx.job
    if not j.get("rollout_format"):
        return []
    spec = ctx.config.spec
    injected = verl_ignored(spec, j.get("rollout_engine"))
    if injected is None:
        return [unknown("V2", "SGLang's ignored layers come from the checkpoint and SGLANG_FP8_IGNORED_LAYERS, which "
                        "pre-flight does not read")]
    injected = set(injected)
    missing = [m for m in required_high_precision(spec) if m not in injected]
    if missing:
        q = j.fact("engine_quantization")
        return [finding("V2", q.key, q.value, f"{len(missing)} GEMM(s) the model keeps in high precision are not in "
                        f"verl's ignored_layers (model.layers.N.mlp.gate only): {missing[:4]}",
                        "serve this model with a BF16 rollout (quantization=null), or extend verl's ignored_layers")]
    return []


@invariant("V3", "job", "verl's FP8 E2E with FP32 block scales",
           "verl FP8 training with the blockwise recipe runs with NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1, which verl's "
           "docs require and its code never sets or checks", needs=NEEDS, stacks=VERL, live=False,
           source="verl docs/low_precision/fp8.md ('FP8 End-to-End', Requirements: NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1); "
                  "no verl code reads it at 1dda039b; Blackwell E2E failure verl #6172",
           why="Transformer Engine defaults to power-of-two block scales; verl's rollout quantizer writes FP32 scales "
               "(no pow2 option). Without the variable the trainer and the sampler use different scales. Export "
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 to the workers (ray_kwargs.ray_init.runtime_env.env_vars). On "
               "Blackwell TE's blockwise recipe cannot use FP32 scales (C3): there, verl's FP8 E2E cannot agree.")
def v3_nvte(ctx: CheckContext):
    j = ctx.job
    if j.get("fp8_training") and j.get("recipe") == "blockwise":
        e = j.fact("env.trainer.NVTE_FP8_BLOCK_SCALING_FP32_SCALES")
        if e.value != "1":
            return [finding("V3", e.key, e.value, f"verl's FP8 E2E needs FP32 block scales ({e.origin}): the trainer "
                            "quantizes with power-of-two scales, verl's rollout with FP32",
                            "export NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 to the workers")]
    return []


@invariant("V4", "job", "engine_kwargs do not replace verl's FP8 settings",
           "with rollout.quantization set, engine_kwargs.vllm writes neither quantization nor hf_overrides: verl spreads "
           "engine_kwargs last, so they silently replace its FP8 config", needs=NEEDS, stacks=VERL, live=False,
           source=f"verl {SERVER}:302-327 (`**engine_kwargs` after quantization / hf_overrides)",
           why="engine_kwargs.vllm.hf_overrides replaces verl's whole FP8 quantization_config (block size, router "
               "exclusions), and engine_kwargs.vllm.quantization the method, with no error. Set FP8 through "
               "rollout.quantization / quantization_config_file only.")
def v4_engine_kwargs(ctx: CheckContext):
    j, out = ctx.job, []
    if j.get("engine_quantization") is None:
        return out
    q = j.get("engine_quantization")
    k = VERL_VLLM_KWARGS + "quantization"
    if j.has(k) and j.value(k) != q:
        out.append(finding("V4", k, j.value(k), f"replaces rollout.quantization={q} (engine_kwargs are spread last)",
                           f"remove {k}"))
    hk = [key for key in j.flat if key.startswith(VERL_VLLM_KWARGS + "hf_overrides")]
    for key in hk[:1]:
        out.append(finding("V4", key, j.value(key), "engine_kwargs.vllm.hf_overrides replaces verl's FP8 "
                           "quantization_config wholesale (block size, ignored_layers)",
                           f"remove {VERL_VLLM_KWARGS}hf_overrides (use {VERL_ROLLOUT}quantization_config_file)"))
    return out


@invariant("V5", "job", "verl's TRT-LLM FP8 rollout boots on dummy weights",
           "with rollout.name=trtllm and quantization=fp8, actor_rollout_ref.rollout.load_format is dummy",
           needs=NEEDS, stacks=VERL, live=False,
           source="verl verl/workers/rollout/trtllm_rollout/trtllm_async_server.py:207-220 (ValueError 'FP8 "
                  "quantization is only supported for dummy load format')",
           why="verl's TRT-LLM server builds the FP8 model empty and fills it at the first refit; it raises at server "
               "launch for any other load_format. Set actor_rollout_ref.rollout.load_format=dummy.")
def v5_trtllm_dummy(ctx: CheckContext):
    j = ctx.job
    lf = j.fact("load_format")
    if j.get("rollout_engine") == "trtllm" and j.get("engine_quantization") == "fp8" and \
            lf.value != "dummy":
        return [finding("V5", lf.key, lf.value, "verl's TRT-LLM FP8 rollout needs load_format=dummy (raises at launch)",
                        f"set {lf.key}=dummy")]
    return []
