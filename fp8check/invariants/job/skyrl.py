"""The checks SkyRL 0.4.0 runs on its own FP8 config, as job rules: K2, K4, K7, K8, K10, K11, K13-K17, K19,
K23-K26 and X6 -- including the refusals SkyRL makes only at run time inside its weight-sync code (model spec K19,
batched MXFP8 experts K23, the MX cast backend K24). Each failing finding names where SkyRL 0.4.0 raises (file and
line in the released wheel: harness.jobconfig.versions.SKYRL_REFUSALS, the one list of them)."""
from __future__ import annotations

from fp8check.harness.formats import arch_major
from fp8check.harness.jobconfig.keys import SKYRL_ENGINE, SKYRL_MEGATRON, SKYRL_QCFG
from fp8check.harness.jobconfig.stacks import SKYRL_ENGINE_QUANT
from fp8check.harness.jobconfig.skyrl_spec import SPEC_MODEL_TYPES   # SkyRL's models/qwen35.py:77
from fp8check.harness.jobconfig.versions import (CFG, FQ, Q, S, SKYRL_PRE_RELEASE, SKYRL_PRE_RELEASE_VERDICT,
                                                 SKYRL_RELEASE, U, V, skyrl_raises, skyrl_source)

from ..base import CheckContext, invariant
from .common import NEEDS, SKYRL, finding



def _wire(j):
    return j.get("wire") if j.stack == "skyrl" else None


@invariant("K2", "job", "SkyRL's released names",
           "the job uses SkyRL 0.4.0's names: fp8_weight_sync_mode is null, blockwise, mxfp8 or auto, and no variable "
           "of SkyRL's unreleased FP8 branch (NVTE_FP8_BLOCK_AMAX_EPSILON) is relied on", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("unsupported-wire") + "; names from PR #1898 (refs/pull/1898): serialized_blockwise "
                  "renamed in 42e8eec3, NVTE_FP8_BLOCK_AMAX_EPSILON dropped in 0010f48d",
           why="The SkyRL FP8 article and early PR #1898 wrote fp8_weight_sync_mode=serialized_blockwise and "
               "NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4. Both changed before any release: the rename kept no alias, so "
               "SkyRL 0.4.0 raises at startup, and the amax floor variable is read by nothing. One finding names "
               "every such name with the versions that accept it. Write blockwise (or auto) and drop the variable.")
def k2_old_names(ctx: CheckContext):
    j = ctx.job
    w = j.fact("wire_written")
    eps = j.getenv("NVTE_FP8_BLOCK_AMAX_EPSILON")
    found = [n for n, here in (("serialized_blockwise", w.value == "serialized_blockwise"),
                               ("NVTE_FP8_BLOCK_AMAX_EPSILON", eps not in (None, ""))) if here]
    if not found:
        return []
    names = "; ".join(f"{SKYRL_PRE_RELEASE[n][0]}: {SKYRL_PRE_RELEASE[n][1]}" for n in found)
    wire = "serialized_blockwise" in found
    fix = "; ".join((["write blockwise (or auto)"] if wire else []) +
                    (["remove NVTE_FP8_BLOCK_AMAX_EPSILON (the serializer floors amax at 1e-10, "
                      f"{FQ}:85; TE 2.20.2 hard-codes amax_epsilon=0)"] if eps not in (None, "") else []))
    key, value = (w.key, w.value) if wire else ("NVTE_FP8_BLOCK_AMAX_EPSILON", eps)
    return [finding("K2", key, value, f"names from SkyRL's unreleased FP8 branch (PR #1898, the SkyRL FP8 "
                    f"article): {names}. {SKYRL_PRE_RELEASE_VERDICT}", fix,
                    severity=None if wire else "warning")]


@invariant("K4", "job", "the engine's quantization is the one SkyRL forces",
           "with FP8 weight sync, engine_init_kwargs.quantization (if written) is what SkyRL forces for the wire: fp8 "
           "for blockwise, compressed-tensors for mxfp8", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("quantization-forced") + f"; {Q}:194-209 (wire_to_engine_quantization)",
           why="SkyRL starts vLLM with the quantization method that serves its wire and refuses a user value that "
               "differs (ValueError). Remove engine_init_kwargs.quantization, or set the one the wire needs.")
def k4_engine_quant(ctx: CheckContext):
    j = ctx.job
    wire = _wire(j)
    q = j.fact("engine_quantization")
    if wire and q.value is not None and not q.origin.startswith("forced") and q.value != SKYRL_ENGINE_QUANT[wire]:
        return [finding("K4", q.key, q.value, f"the {wire} wire is served by quantization={SKYRL_ENGINE_QUANT[wire]}: "
                        f"{skyrl_raises('quantization-forced')} on another value", f"remove it or set {q.key}={SKYRL_ENGINE_QUANT[wire]}")]
    return []


@invariant("K7", "job", "persistent FP8 parameters need the FP8 all-gather",
           "fp8_param (persistent FP8 weights) needs ddp_config.fp8_param_gather=true, unless "
           "trainer.policy.inference_only_init", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("fp8-param-gather") + " validate_megatron_cfg (ValueError 'Persistent policy fp8_param "
                  "training requires ...fp8_param_gather=true')",
           why="With FP8 parameters the DDP all-gather must move FP8 shards, or every rank re-quantizes a BF16 "
               "gather. NeMo RL derives fp8_param_gather from fp8_param itself (megatron/setup.py:1376-1387); SkyRL "
               "makes you set it.")
def k7_param_gather(ctx: CheckContext):
    j = ctx.job
    p = j.fact("fp8_param")
    key = SKYRL_MEGATRON + "ddp_config.fp8_param_gather"
    if p.value and p.key and p.key.startswith(SKYRL_MEGATRON) and \
            not j.value("trainer.policy.inference_only_init") and not j.value(key, False):
        return [finding("K7", key, j.value(key), "persistent FP8 parameters need the FP8 all-gather: "
                        f"{skyrl_raises('fp8-param-gather')}", f"set {key}=true")]
    return []


@invariant("K8", "job", "FP8 weight sync needs the Megatron trainer",
           "serialized FP8 weight sync reads the FP8 forward weights from Transformer Engine: trainer.strategy is "
           "megatron (SkyRL's default is fsdp)", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("fp8-sync-needs-megatron") + f"; default strategy fsdp ({CFG}:1466)",
           why="Only the Megatron backend has Transformer Engine's FP8 weights to send. Set trainer.strategy=megatron.")
def k8_strategy(ctx: CheckContext):
    j = ctx.job
    if _wire(j) and j.value("trainer.strategy") != "megatron":
        return [finding("K8", "trainer.strategy", j.value("trainer.strategy"), "serialized FP8 weight sync needs the "
                        f"Megatron trainer ({j.origin.get('trainer.strategy', '')}): {skyrl_raises('fp8-sync-needs-megatron')}",
                        "set trainer.strategy=megatron")]
    return []


@invariant("K10", "job", "the engine boots on dummy weights",
           "with FP8 weight sync, engine_init_kwargs.load_format (if written) is dummy: the first sync supplies the "
           "weights", needs=NEEDS, stacks=SKYRL, live=False, source=skyrl_source("load-format-dummy"),
           why="SkyRL builds the FP8 engine without a checkpoint and refuses any other load_format (ValueError). "
               "Remove engine_init_kwargs.load_format.")
def k10_load_format(ctx: CheckContext):
    j = ctx.job
    lf = j.fact("load_format")
    if _wire(j) and lf.value is not None and not lf.origin.startswith("forced") and lf.value != "dummy":
        return [finding("K10", lf.key, lf.value, "FP8 weight sync boots the engine on dummy weights: "
                        f"{skyrl_raises('load-format-dummy')} on another load_format", f"remove {lf.key}")]
    return []


@invariant("K11", "job", "the quantization_config SkyRL injects",
           "user hf_overrides.quantization_config keys equal what SkyRL injects for the wire (blockwise: quant_method "
           "fp8, activation_scheme dynamic; mxfp8: quant_method compressed-tensors, format float-quantized, the "
           "exclusions under `ignore`)", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("quantization-config-injected") + f"; {V}:147-185 "
                  "(get_serialized_fp8_quantization_config)",
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
            out.append(finding("K11", k, j.value(k), f"SkyRL injects {name}={v} for the {wire} wire: "
                               f"{skyrl_raises('quantization-config-injected')} on another value", f"remove {k}"))
    k = SKYRL_QCFG + "ignored_layers"
    if wire == "mxfp8" and j.has(k):
        out.append(finding("K11", k, j.value(k), "compressed-tensors (the mxfp8 wire) reads `ignore`, not "
                           "`ignored_layers`: this list excludes nothing", f"remove {k} (SkyRL sets `ignore`)"))
    return out


@invariant("K13", "job", "MXFP8 GDN in_proj shards on 32",
           "under mxfp8, a gated delta-net model's fused in_proj output dim (2*Dk*Hk + 2*Dv*Hv + 2*Hv) divides by "
           "32 * trainer TP", needs=NEEDS, live=False,
           source=skyrl_source("mxfp8-gdn-tp") + " validate_mxfp8_gdn_tp_alignment (Megatron "
                  "megatron/core/ssm/gated_delta_net.py fuses q|k|v|z|b|a; TE MXFP8Quantizer::create_tensor needs every "
                  "shard dim % 32)",
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
                        f"multiple of 32*TP = {32 * tp.value}: each rank's shard cannot be MXFP8-quantized; "
                        f"{skyrl_raises('mxfp8-gdn-tp')}",
                        f"pick a TP that divides {dim / 32:g}, or use fp8_recipe=blockwise")]
    return []


@invariant("K14", "job", "the DeepGEMM E8M0 pin",
           "SkyRL's blockwise wire has VLLM_USE_DEEP_GEMM_E8M0=0 with FP32 scales and 1 with power-of-two scales (any "
           "GPU); any stack's blockwise FP8 on sm100+ with DeepGEMM on has it 1", needs=NEEDS, live=False,
           source=skyrl_source("fp32-scales-e8m0", "pow2-scales-e8m0") + " (prepare_runtime_environment pins and "
                  "validates it); Blackwell DeepGEMM fp8_gemm_nt accepts only E8M0 scale factors (vLLM PR #37806)",
           why="Blackwell's DeepGEMM asserts 'Unsupported architecture or scaling factor types' without E8M0 scale "
               "factors, so E8M0=0 there fails in the first forward (NeMo RL's use_deep_gemm forces 0 on every arch). "
               "FP32 wire scales need E8M0=0, or vLLM requantizes them (C2); SkyRL 0.4.0 refuses any other value even "
               "with DeepGEMM off, and pins power-of-two wire scales to 1 on every GPU (their E8M0 requantization is "
               "lossless). Unset the variable (the stack then pins it) or set the value named here.")
def k14_e8m0(ctx: CheckContext):
    j = ctx.job
    e8, dg = j.fact("env.rollout.VLLM_USE_DEEP_GEMM_E8M0"), j.fact("env.rollout.VLLM_USE_DEEP_GEMM")
    scales = j.get("rollout_scales")
    if j.get("rollout_format") != "blockwise":
        return []
    if j.stack == "skyrl" and scales == "fp32" and e8.value != "0":
        return [finding("K14", e8.key, e8.value, "FP32 wire scales with VLLM_USE_DEEP_GEMM_E8M0 != 0 (vLLM would "
                        f"requantize them to power-of-two): {skyrl_raises('fp32-scales-e8m0')}",
                        "unset it (SkyRL pins 0)")]
    if j.stack == "skyrl" and scales == "pow2" and e8.value != "1":
        return [finding("K14", e8.key, e8.value, "power-of-two wire scales with VLLM_USE_DEEP_GEMM_E8M0 != 1: "
                        f"{skyrl_raises('pow2-scales-e8m0')}", "unset it (SkyRL pins 1)")]
    blackwell = (arch_major(j.get("gpu")) or 9) >= 10 and not j.get("gpu_assumed")
    if blackwell and dg.value == "1" and e8.value == "0":
        return [finding("K14", e8.key, e8.value, f"{j.get('gpu')} DeepGEMM accepts only E8M0 scale factors: "
                        f"E8M0=0 ({e8.origin}) fails in the first forward",
                        "set VLLM_USE_DEEP_GEMM_E8M0=1 with power-of-two scales (or VLLM_USE_DEEP_GEMM=0)")]
    return []


@invariant("K15", "job", "an `auto` wire needs a concrete recipe on the driver",
           "fp8_weight_sync_mode=auto with fp8_recipe=auto needs a driver that sees a GPU: a GPU-less driver leaves "
           "the recipe auto and SkyRL refuses to guess the wire", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("auto-wire-auto-recipe") + " resolve_auto_wire_format (ValueError \"cannot be resolved "
                  "while fp8_recipe is still 'auto'\")",
           why="The wire shapes every engine's boot config, so unlike the recipe it cannot defer to the workers. On a "
               "GPU-less driver write fp8_recipe (blockwise | mxfp8) or fp8_weight_sync_mode explicitly.")
def k15_auto_auto(ctx: CheckContext):
    j = ctx.job
    if j.get("wire_written") == "auto" and j.get("recipe_written") == "auto" and \
            j.get("gpu_assumed"):
        w = j.fact("wire_written")
        return [finding("K15", w.key, w.value, "the driver sees no GPU, so fp8_recipe stays auto and the wire cannot "
                        f"be resolved: {skyrl_raises('auto-wire-auto-recipe')}",
                        f"write {j.fact('recipe_written').key}=blockwise|mxfp8 or {w.key} "
                        "explicitly (and pass --gpu for the workers' GPU)")]
    return []


@invariant("K16", "job", "FP8 weight sync goes over the nccl backend",
           "with FP8 weight sync, generator.inference_engine.weight_sync_backend is nccl (CUDA IPC when colocated): "
           "not delta, sharded_rdt (rdt) or a name the Megatron path does not know", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("sync-backend", "megatron-backends"),
           why="Neither delta nor sharded_rdt can carry the quantized payload + scale pairs FP8 weight sync is made "
               "of (the RDT sources export tensors cast to the inference dtype; the delta checkpoint format has no "
               "place for scale tensors), and the Megatron path knows only nccl, delta and sharded_rdt. SkyRL 0.4.0 "
               "refuses each when the config is built. Use weight_sync_backend=nccl.")
def k16_backend(ctx: CheckContext):
    j = ctx.job
    k = SKYRL_ENGINE + "weight_sync_backend"
    v = j.value(k)
    if _wire(j) and v != "nccl":
        pushes = v in ("delta", "sharded_rdt", "rdt")
        why = (f"serialized FP8 weight sync cannot go over {v}: {skyrl_raises('sync-backend')}" if pushes else
               f"the Megatron path knows only nccl, delta and sharded_rdt: {skyrl_raises('megatron-backends')}")
        return [finding("K16", k, v, why, f"set {k}=nccl")]
    return []


@invariant("K17", "job", "FP8 weight sync serves through vLLM",
           "with FP8 weight sync, generator.inference_engine.backend is vllm", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("megatron-serves-vllm") + " (validate_megatron_cfg: only vllm with megatron)",
           why="SkyRL's Megatron path and its FP8 receiver exist for vLLM only. Set generator.inference_engine.backend=vllm.")
def k17_vllm(ctx: CheckContext):
    j = ctx.job
    k = SKYRL_ENGINE + "backend"
    if _wire(j) and j.value(k) != "vllm":
        return [finding("K17", k, j.value(k), "SkyRL's Megatron FP8 sync serves through vLLM only: "
                        f"{skyrl_raises('megatron-serves-vllm')}", f"set {k}=vllm")]
    return []


@invariant("K19", "job", "SkyRL has an FP8 spec for the model",
           "SkyRL's FP8 weight sync finds a registered ModelFp8Spec for the model (at PR #2072 only Qwen3.5: "
           "model_type qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text)", needs=NEEDS, stacks=SKYRL, live=False,
           severity="warning",
           source=skyrl_source("model-spec") + " (_serialized_fp8_ignored_layers raises 'no registered model spec'); "
                  "skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py:77",
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
                            f"{skyrl_raises('model-spec')} at engine start unless you register one", "register a ModelFp8Spec for it "
                            "(skyrl/backends/skyrl_train/weight_sync/fp8/models/README.md)")]
    return []


@invariant("X6", "exclusion", "the engine's ignored_layers come from the one exclusion set",
           "an explicit engine ignored_layers (blockwise) / ignore (mxfp8) override equals the trainer's high-precision "
           "GEMMs exactly", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("ignored-layers-override") + " (raises when the user list differs from the spec's)",
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
                        f"high-precision set (missing {sorted(want - got)[:3]}, extra {sorted(got - want)[:3]}); "
                        f"{skyrl_raises('ignored-layers-override')} when it differs from its model spec's",
                        "derive ignored_layers from the same exclusion set (remove the override)")]
    return []


@invariant("K23", "job", "MXFP8 batched experts reduce over multiples of 32",
           "with the mxfp8 wire on an MoE model, every routed expert's reduction dim divides by 32: hidden_size for "
           "gate|up (w13) and moe_intermediate_size for down (w2)", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("mxfp8-experts-k") + f" (batched MoE experts, {V}:199-238, are not filtered like "
                  "dense weights; 'MXFP8 requires the reduction dimension to be a multiple of 32' raised while "
                  "serializing)",
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
                        f": SkyRL's MXFP8 serializer refuses the routed experts at the first sync: {skyrl_raises('mxfp8-experts-k')}",
                        "use generator.inference_engine.fp8_weight_sync_mode=blockwise for this model")]
    return []


@invariant("K24", "job", "the MX cast backend runs on this GPU",
           "SKYRL_MX_CAST_BACKEND=te (Transformer Engine's MXFP8 quantizer for the wire) only on a GPU where TE's "
           "MXFP8 runs (sm100+)", needs=NEEDS, stacks=SKYRL, live=False,
           source=skyrl_source("mx-cast-backend") + " ('SKYRL_MX_CAST_BACKEND=te but the TE MXFP8 quantizer is "
                  "unusable on this device', raised when the wire is first cast)",
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
        return [finding("K24", "SKYRL_MX_CAST_BACKEND", v, f"TE's MXFP8 quantizer does not run on {arch}, and the "
                        f"wire's first cast fails: {skyrl_raises('mx-cast-backend')}", "unset SKYRL_MX_CAST_BACKEND, or train on sm100+")]
    return []


@invariant("K25", "job", "FP8 weight sync has no speculative decoding",
           "with FP8 weight sync, no speculative decoding: no generator.inference_engine.speculative_config and no "
           "trainer.mtp.enabled (which sets one unless SKYRL_DISABLE_SPEC=1)", needs=NEEDS, stacks=SKYRL,
           live=False,
           source=skyrl_source("speculative-decoding"),
           why="SkyRL's speculative decoding drafts with the policy's MTP head, which every weight sync must reach, "
               "and vLLM's drafter has no loader for the serialized FP8 wire. SkyRL 0.4.0 refuses the pair at "
               "startup. Turn FP8 weight sync off, or drop speculative decoding (SKYRL_DISABLE_SPEC=1 keeps MTP "
               "training without it).")
def k25_speculative(ctx: CheckContext):
    j = ctx.job
    if not _wire(j):
        return []
    sk = SKYRL_ENGINE + "speculative_config"
    written = [k for k in j.flat if (k == sk or k.startswith(sk + ".")) and j.value(k) is not None]
    mtp = "trainer.mtp.enabled"
    if written:
        key, value, how = sk, {k[len(sk) + 1:] or "": j.value(k) for k in written}, "speculative_config is set"
    elif j.value(mtp) and j.getenv("SKYRL_DISABLE_SPEC") != "1":
        key, value, how = mtp, True, "trainer.mtp.enabled sets speculative_config (method mtp)"
    else:
        return []
    w = j.fact("wire")
    return [finding("K25", key, value, f"{how} with {w.key}={j.flat.get(w.key, w.value)}: the drafter has no loader "
                    f"for the serialized FP8 wire; {skyrl_raises('speculative-decoding')}",
                    "remove speculative_config (or export SKYRL_DISABLE_SPEC=1 with trainer.mtp.enabled), or turn FP8 "
                    "weight sync off")]


@invariant("K26", "job", "a GPU-less SkyRL driver is told the block-scale contract",
           "when the job runs FP8 (training, persistent parameters or the blockwise wire) and the driver sees no GPU, "
           "NVTE_FP8_BLOCK_SCALING_FP32_SCALES is exported in the driver's environment", needs=NEEDS, stacks=SKYRL,
           live=False,
           source=skyrl_source("gpu-less-driver") + " (prepare_runtime_environment); fixes the PR #1898 review's 'CPU "
                  "driver forces Hopper FP8 scales'",
           why="SkyRL fixes one block-scale contract for every Ray actor before ray.init, from the driver's own GPU; a "
               "driver that sees none cannot tell Hopper (FP32 scales) from Blackwell (power-of-two), so SkyRL 0.4.0 "
               "refuses to start. Pre-flight judges the machine it runs on as the driver when --gpu is auto. Export "
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 (Hopper) or 0 (Blackwell).")
def k26_gpu_less_driver(ctx: CheckContext):
    j = ctx.job
    if not j.get("gpu_assumed"):
        return []
    var = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
    contract = j.get("wire") == "blockwise" or j.get("fp8_training") or bool(j.get("fp8_param"))
    if contract and j.getenv(var) in (None, ""):
        return [finding("K26", var, None, "FP8 is on and the driver sees no GPU, so the block-scale contract cannot "
                        f"be inferred from the workers' architecture: {skyrl_raises('gpu-less-driver')}",
                        f"export {var}=1 (Hopper, FP32 scales) or {var}=0 (Blackwell, power-of-two scales)")]
    return []
