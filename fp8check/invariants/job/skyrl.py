"""The checks SkyRL's FP8 weight sync runs on its own config (PR #1898, merged; PR #2072 head 4580e91e, MXFP8),
as job rules: K2, K4, K7, K8, K10, K11, K13-K17, K19, K23, K24 and X6 -- including the refusals SkyRL makes only
at run time inside its weight-sync code (delta backend K16, model spec K19, batched MXFP8 experts K23, the MX cast
backend K24). Paths are relative to SkyRL's `skyrl/`."""
from __future__ import annotations

from fp8check.harness.formats import arch_major
from fp8check.harness.jobconfig.keys import SKYRL_ENGINE, SKYRL_MEGATRON, SKYRL_QCFG
from fp8check.harness.jobconfig.stacks import SKYRL_ENGINE_QUANT

from ..base import CheckContext, invariant
from .common import NEEDS, SKYRL, finding

U = "skyrl/train/utils/utils.py"
Q = "skyrl/backends/skyrl_train/distributed/megatron/quantization_utils.py"
S = "skyrl/backends/skyrl_train/inference_servers/utils.py"
SPEC_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def _wire(j):
    return j.get("wire") if j.stack == "skyrl" else None


@invariant("K2", "job", "the wire format's current name",
           "fp8_weight_sync_mode is one SkyRL accepts: null, blockwise, mxfp8 or auto (`serialized_blockwise`, the "
           "pre-rename name, is refused)", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {U}:610-614 validate_inference_engine_cfg (Unsupported fp8_weight_sync_mode); renamed in "
                  "commit 42e8eec3 with no alias",
           why="PR #1887 and early #1898 docs called the blockwise wire `serialized_blockwise`; the rename kept no "
               "alias, so SkyRL raises ValueError at startup. Write blockwise (or auto).")
def k2_old_name(ctx: CheckContext):
    w = ctx.job.fact("wire_written")
    if w.value == "serialized_blockwise":
        return [finding("K2", w.key, w.value, "the pre-rename name of the blockwise wire: SkyRL raises "
                        "'Unsupported fp8_weight_sync_mode'", "write blockwise (or auto)")]
    return []


@invariant("K4", "job", "the engine's quantization is the one SkyRL forces",
           "with FP8 weight sync, engine_init_kwargs.quantization (if written) is what SkyRL forces for the wire: fp8 "
           "for blockwise, compressed-tensors for mxfp8", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {S}:52-57, 75-77 (_set_or_validate raises on a different value); {Q}:180-195 "
                  "(wire_to_engine_quantization)",
           why="SkyRL starts vLLM with the quantization method that serves its wire and refuses a user value that "
               "differs (ValueError). Remove engine_init_kwargs.quantization, or set the one the wire needs.")
def k4_engine_quant(ctx: CheckContext):
    j = ctx.job
    wire = _wire(j)
    q = j.fact("engine_quantization")
    if wire and q.value is not None and not q.origin.startswith("forced") and q.value != SKYRL_ENGINE_QUANT[wire]:
        return [finding("K4", q.key, q.value, f"the {wire} wire is served by quantization={SKYRL_ENGINE_QUANT[wire]}: "
                        "SkyRL raises on another value", f"remove it or set {q.key}={SKYRL_ENGINE_QUANT[wire]}")]
    return []


@invariant("K7", "job", "persistent FP8 parameters need the FP8 all-gather",
           "fp8_param (persistent FP8 weights) needs ddp_config.fp8_param_gather=true, unless "
           "trainer.policy.inference_only_init", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {U}:216-226 validate_megatron_cfg (ValueError 'Persistent policy fp8_param training "
                  "requires ...fp8_param_gather=true')",
           why="With FP8 parameters the DDP all-gather must move FP8 shards, or every rank re-quantizes a BF16 "
               "gather. NeMo RL derives fp8_param_gather from fp8_param itself (megatron/setup.py:1376-1387); SkyRL "
               "makes you set it.")
def k7_param_gather(ctx: CheckContext):
    j = ctx.job
    p = j.fact("fp8_param")
    key = SKYRL_MEGATRON + "ddp_config.fp8_param_gather"
    if p.value and p.key and p.key.startswith(SKYRL_MEGATRON) and \
            not j.value("trainer.policy.inference_only_init") and not j.value(key, False):
        return [finding("K7", key, j.value(key), "persistent FP8 parameters need the FP8 all-gather",
                        f"set {key}=true")]
    return []


@invariant("K8", "job", "FP8 weight sync needs the Megatron trainer",
           "serialized FP8 weight sync reads the FP8 forward weights from Transformer Engine: trainer.strategy is "
           "megatron (SkyRL's default is fsdp)", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {U}:615-617 validate_inference_engine_cfg; default strategy fsdp (train/config/config.py:1399)",
           why="Only the Megatron backend has Transformer Engine's FP8 weights to send. Set trainer.strategy=megatron.")
def k8_strategy(ctx: CheckContext):
    j = ctx.job
    if _wire(j) and j.value("trainer.strategy") != "megatron":
        return [finding("K8", "trainer.strategy", j.value("trainer.strategy"), "serialized FP8 weight sync needs the "
                        f"Megatron trainer ({j.origin.get('trainer.strategy', '')})", "set trainer.strategy=megatron")]
    return []


@invariant("K10", "job", "the engine boots on dummy weights",
           "with FP8 weight sync, engine_init_kwargs.load_format (if written) is dummy: the first sync supplies the "
           "weights", needs=NEEDS, stacks=SKYRL, live=False, source=f"SkyRL {S}:78 (_set_or_validate load_format='dummy')",
           why="SkyRL builds the FP8 engine without a checkpoint and refuses any other load_format (ValueError). "
               "Remove engine_init_kwargs.load_format.")
def k10_load_format(ctx: CheckContext):
    j = ctx.job
    lf = j.fact("load_format")
    if _wire(j) and lf.value is not None and not lf.origin.startswith("forced") and lf.value != "dummy":
        return [finding("K10", lf.key, lf.value, "FP8 weight sync boots the engine on dummy weights: SkyRL raises on "
                        "another load_format", f"remove {lf.key}")]
    return []


@invariant("K11", "job", "the quantization_config SkyRL injects",
           "user hf_overrides.quantization_config keys equal what SkyRL injects for the wire (blockwise: quant_method "
           "fp8, activation_scheme dynamic; mxfp8: quant_method compressed-tensors, format float-quantized, the "
           "exclusions under `ignore`)", needs=NEEDS, stacks=SKYRL, live=False,
           source="SkyRL skyrl/backends/skyrl_train/weight_sync/fp8/vllm_format.py:113-147 "
                  f"(get_serialized_fp8_quantization_config); {S}:98-111 (_set_or_validate)",
           why="SkyRL raises on a differing value; and under the mxfp8 wire (compressed-tensors) an `ignored_layers` "
               "list is read by nobody: compressed-tensors names its exclusions `ignore`. Remove the override.")
def k11_qcfg(ctx: CheckContext):
    j, out = ctx.job, []
    wire = _wire(j)
    if not wire:
        return out
    want = {"quant_method": "fp8", "activation_scheme": "dynamic"} if wire == "blockwise" else \
        {"quant_method": "compressed-tensors", "format": "float-quantized"}
    for name, v in want.items():
        k = SKYRL_QCFG + name
        if j.has(k) and j.value(k) != v:
            out.append(finding("K11", k, j.value(k), f"SkyRL injects {name}={v} for the {wire} wire and raises on "
                               "another value", f"remove {k}"))
    k = SKYRL_QCFG + "ignored_layers"
    if wire == "mxfp8" and j.has(k):
        out.append(finding("K11", k, j.value(k), "compressed-tensors (the mxfp8 wire) reads `ignore`, not "
                           "`ignored_layers`: this list excludes nothing", f"remove {k} (SkyRL sets `ignore`)"))
    return out


@invariant("K13", "job", "MXFP8 GDN in_proj shards on 32",
           "under mxfp8, a gated delta-net model's fused in_proj output dim (2*Dk*Hk + 2*Dv*Hv + 2*Hv) divides by "
           "32 * trainer TP", needs=NEEDS, live=False,
           source=f"SkyRL {Q}:100-150 validate_mxfp8_gdn_tp_alignment (Megatron megatron/core/ssm/gated_delta_net.py "
                  "fuses q|k|v|z|b|a; TE MXFP8Quantizer::create_tensor needs every shard dim % 32)",
           why="Megatron's own guard checks the global dim, which can pass while each TP rank's [in_proj_dim/TP, hidden] "
               "shard is not a multiple of 32; TE then asserts deep inside model build. Qwen3.5's 12352 works at TP=2 "
               "and fails at TP=4. Pick a TP dividing in_proj_dim/32, or use blockwise.")
def k13_gdn(ctx: CheckContext):
    j = ctx.job
    spec = ctx.config.spec
    if not (j.get("fp8_training") and j.get("recipe") == "mxfp8" and "linear_attention" in spec.layer_types):
        return []
    d, hk, hv = spec.linear_head_dim, spec.linear_num_k_heads, spec.linear_num_v_heads
    dim = 2 * d * hk + 2 * d * hv + 2 * hv
    tp = j.fact("trainer_tp")
    if dim % (32 * tp.value):
        return [finding("K13", tp.key, tp.value, f"GDN in_proj dim {dim} = 2*{d}*{hk} + 2*{d}*{hv} + 2*{hv} is not a "
                        f"multiple of 32*TP = {32 * tp.value}: each rank's shard cannot be MXFP8-quantized",
                        f"pick a TP that divides {dim / 32:g}, or use fp8_recipe=blockwise")]
    return []


@invariant("K14", "job", "the DeepGEMM E8M0 pin",
           "blockwise FP8 in the engine on sm100+ with DeepGEMM on has VLLM_USE_DEEP_GEMM_E8M0=1; SkyRL's FP32-scale "
           "wire has it 0", needs=NEEDS, live=False,
           source=f"SkyRL {U}:960-981 (prepare_runtime_environment pins and validates it); Blackwell DeepGEMM "
                  "fp8_gemm_nt accepts only E8M0 scale factors (vLLM PR #37806)",
           why="Blackwell's DeepGEMM asserts 'Unsupported architecture or scaling factor types' without E8M0 scale "
               "factors, so E8M0=0 there fails in the first forward (NeMo RL's use_deep_gemm forces 0 on every arch). "
               "FP32 wire scales need E8M0=0, or vLLM requantizes them (C2); SkyRL refuses any other value even with "
               "DeepGEMM off. Unset the variable (the stack then pins it) or set the value named here.")
def k14_e8m0(ctx: CheckContext):
    j = ctx.job
    e8, dg = j.fact("env.rollout.VLLM_USE_DEEP_GEMM_E8M0"), j.fact("env.rollout.VLLM_USE_DEEP_GEMM")
    scales = j.get("rollout_scales")
    if j.get("rollout_format") != "blockwise":
        return []
    if j.stack == "skyrl" and scales == "fp32" and e8.value != "0":
        return [finding("K14", e8.key, e8.value, "FP32 wire scales with VLLM_USE_DEEP_GEMM_E8M0 != 0: SkyRL raises "
                        "(vLLM would requantize them to power-of-two)", "unset it (SkyRL pins 0)")]
    blackwell = (arch_major(j.get("gpu")) or 9) >= 10 and not j.get("gpu_assumed")
    if j.stack == "skyrl" and scales == "pow2" and blackwell and e8.value != "1":
        return [finding("K14", e8.key, e8.value, f"power-of-two wire scales on {j.get('gpu')} with "
                        "VLLM_USE_DEEP_GEMM_E8M0 != 1: SkyRL raises (Blackwell DeepGEMM takes E8M0 scale factors only)",
                        "unset it (SkyRL pins 1)")]
    if blackwell and dg.value == "1" and e8.value == "0":
        return [finding("K14", e8.key, e8.value, f"{j.get('gpu')} DeepGEMM accepts only E8M0 scale factors: "
                        f"E8M0=0 ({e8.origin}) fails in the first forward",
                        "set VLLM_USE_DEEP_GEMM_E8M0=1 with power-of-two scales (or VLLM_USE_DEEP_GEMM=0)")]
    return []


@invariant("K15", "job", "an `auto` wire needs a concrete recipe on the driver",
           "fp8_weight_sync_mode=auto with fp8_recipe=auto needs a driver that sees a GPU: a GPU-less driver leaves "
           "the recipe auto and SkyRL refuses to guess the wire", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {Q}:153-177 resolve_auto_wire_format (ValueError \"cannot be resolved while fp8_recipe is "
                  "still 'auto'\")",
           why="The wire shapes every engine's boot config, so unlike the recipe it cannot defer to the workers. On a "
               "GPU-less driver write fp8_recipe (blockwise | mxfp8) or fp8_weight_sync_mode explicitly.")
def k15_auto_auto(ctx: CheckContext):
    j = ctx.job
    if j.get("wire_written") == "auto" and j.get("recipe_written") == "auto" and \
            j.get("gpu_assumed"):
        w = j.fact("wire_written")
        return [finding("K15", w.key, w.value, "the driver sees no GPU, so fp8_recipe stays auto and SkyRL cannot "
                        "resolve the wire", f"write {j.fact('recipe_written').key}=blockwise|mxfp8 or {w.key} "
                        "explicitly (and pass --gpu for the workers' GPU)")]
    return []


@invariant("K16", "job", "FP8 weight sync goes over the nccl backend",
           "with FP8 weight sync, generator.inference_engine.weight_sync_backend is nccl", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {U}:209-212 (megatron allows nccl | delta); "
                  "skyrl/backends/skyrl_train/weight_sync/delta_strategy.py:97-103 (delta + serialized FP8 raises at "
                  "the first sync, not at validation)",
           why="The delta backend cannot carry serialized FP8 chunks and raises only when the first sync runs, hours "
               "into the job; other backends are refused for Megatron. Use weight_sync_backend=nccl.")
def k16_backend(ctx: CheckContext):
    j = ctx.job
    k = SKYRL_ENGINE + "weight_sync_backend"
    if _wire(j) and j.value(k) != "nccl":
        return [finding("K16", k, j.value(k), "serialized FP8 weight sync needs the nccl backend (delta raises at "
                        "the first sync)", f"set {k}=nccl")]
    return []


@invariant("K17", "job", "FP8 weight sync serves through vLLM",
           "with FP8 weight sync, generator.inference_engine.backend is vllm", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {U}:213 (validate_megatron_cfg: only vllm with megatron)",
           why="SkyRL's Megatron path and its FP8 receiver exist for vLLM only. Set generator.inference_engine.backend=vllm.")
def k17_vllm(ctx: CheckContext):
    j = ctx.job
    k = SKYRL_ENGINE + "backend"
    if _wire(j) and j.value(k) != "vllm":
        return [finding("K17", k, j.value(k), "SkyRL's Megatron FP8 sync serves through vLLM only", f"set {k}=vllm")]
    return []


@invariant("K19", "job", "SkyRL has an FP8 spec for the model",
           "SkyRL's FP8 weight sync finds a registered ModelFp8Spec for the model (at PR #2072 only Qwen3.5: "
           "model_type qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text)", needs=NEEDS, stacks=SKYRL, live=False,
           severity="warning",
           source=f"SkyRL {S}:32-49 (_serialized_fp8_ignored_layers raises 'no registered model spec'); "
                  "skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py:73-74",
           why="SkyRL derives the engine's ignored_layers and the quantizable-weight allow-list from a per-model spec, "
               "and refuses a model without one. A warning, not an error: a spec can be registered from your own "
               "code (register_fp8_spec), which pre-flight cannot see.")
def k19_spec(ctx: CheckContext):
    j = ctx.job
    if _wire(j) and j.get("model_known"):
        mt = ctx.config.spec.model_type
        if mt not in SPEC_MODEL_TYPES:
            m = j.fact("model")
            return [finding("K19", m.key, m.value, f"model_type {mt!r} has no SkyRL FP8 spec (registered: Qwen3.5): "
                            "SkyRL raises at engine start unless you register one", "register a ModelFp8Spec for it "
                            "(skyrl/backends/skyrl_train/weight_sync/fp8/models/README.md)")]
    return []


@invariant("X6", "exclusion", "the engine's ignored_layers come from the one exclusion set",
           "an explicit engine ignored_layers (blockwise) / ignore (mxfp8) override equals the trainer's high-precision "
           "GEMMs exactly", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL {S}:52-57, 102-111 (_set_or_validate raises when the user list differs from the spec's)",
           why="Two lists of high-precision modules drift apart: a module BF16 in one engine and FP8 in the other "
               "runs another policy. Remove the override; the list is derived from the one exclusion set.")
def x6_override(ctx: CheckContext):
    j = ctx.job
    wire = _wire(j)
    name = "ignore" if wire == "mxfp8" else "ignored_layers"
    k = SKYRL_QCFG + name
    if not j.has(k) or not isinstance(j.value(k), list):
        return []
    want, got = set(ctx.config.ignored_layers), set(j.value(k))
    if got != want:
        return [finding("X6", k, sorted(got ^ want)[:6], "the engine's ignored_layers differ from the trainer's "
                        f"high-precision set (missing {sorted(want - got)[:3]}, extra {sorted(got - want)[:3]})",
                        "derive ignored_layers from the same exclusion set (remove the override)")]
    return []


V = "skyrl/backends/skyrl_train/weight_sync/fp8/vllm_format.py"
FQ = "skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py"


@invariant("K23", "job", "MXFP8 batched experts reduce over multiples of 32",
           "with the mxfp8 wire on an MoE model, every routed expert's reduction dim divides by 32: hidden_size for "
           "gate|up (w13) and moe_intermediate_size for down (w2)", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL PR #2072 {V}:176-194 and {FQ}:249-254 (batched MoE experts are not filtered like dense "
                  "weights; 'MXFP8 requires the reduction dimension to be a multiple of 32' raised while serializing)",
           why="SkyRL leaves a dense weight whose K is not a multiple of 32 in BF16, but serializes the batched expert "
               "tensors unconditionally and raises at the first sync, hours into the job (Megatron-Bridge exports "
               "experts full-size, so no parallel size changes it). Use the blockwise wire for this model.")
def k23_mx_experts(ctx: CheckContext):
    j, spec = ctx.job, ctx.config.spec
    if _wire(j) != "mxfp8" or not spec.is_moe:
        return []
    bad = [(what, k) for what, k in (("hidden_size (w13's K)", spec.hidden_size),
                                      ("moe_intermediate_size (w2's K)", spec.moe_intermediate_size)) if k % 32]
    if bad:
        w = j.fact("wire")
        return [finding("K23", w.key, w.value, "; ".join(f"{what} {k} is not a multiple of 32" for what, k in bad) +
                        ": SkyRL's MXFP8 serializer raises on the routed experts at the first sync",
                        "use generator.inference_engine.fp8_weight_sync_mode=blockwise for this model")]
    return []


@invariant("K24", "job", "the MX cast backend runs on this GPU",
           "SKYRL_MX_CAST_BACKEND=te (Transformer Engine's MXFP8 quantizer for the wire) only on a GPU where TE's "
           "MXFP8 runs (sm100+)", needs=NEEDS, stacks=SKYRL, live=False,
           source=f"SkyRL PR #2072 {FQ}:192-214 ('SKYRL_MX_CAST_BACKEND=te but the TE MXFP8 quantizer is unusable on "
                  "this device', raised when the wire is first cast)",
           why="The variable forces TE's MXFP8 cast for the serialized wire; TE has no MXFP8 kernels before "
               "Blackwell, and SkyRL raises at the first sync instead of at start-up. Unset it (SkyRL then picks a "
               "cast that runs here) or run the trainer on sm100+.")
def k24_mx_cast(ctx: CheckContext):
    j = ctx.job
    if _wire(j) != "mxfp8":
        return []
    v = j.getenv("SKYRL_MX_CAST_BACKEND")
    arch = j.get("gpu")
    if str(v or "").strip().lower() == "te" and (arch_major(arch) or 9) < 10:
        return [finding("K24", "SKYRL_MX_CAST_BACKEND", v, f"TE's MXFP8 quantizer does not run on {arch}: SkyRL "
                        "raises when the wire is first cast", "unset SKYRL_MX_CAST_BACKEND, or train on sm100+")]
    return []
