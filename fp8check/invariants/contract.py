"""C family: the scale-format and environment contract (recipe x GPU arch x fp8_param x env x LoRA mode), as a
rule table over the one SyncConfig (preflight resolves env vars and GPU into it), plus C1, the data check that
the trainer's bytes are the declared recipe applied to its masters."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from fp8check.harness.jobconfig.versions import skyrl_raises, skyrl_source
from fp8check.harness.kinds import Granularity, ScaleFormat
from fp8check.harness.layouts import scale_name

from .base import CheckContext, fail, invariant, passed, unknown
from .evidence import bit_diff, screened

if TYPE_CHECKING:     # torch is imported in the check that computes: pre-flight imports this without it
    from fp8check.harness.bitview import ScreenMode


def _skyrl_says(ctx: CheckContext, condition: str) -> str:
    """On a SkyRL job (pre-flight), where SkyRL 0.4.0 itself refuses this configuration; elsewhere nothing."""
    job = getattr(ctx, "job", None)
    return f" ({skyrl_raises(condition)})" if job is not None and job.stack == "skyrl" else ""


def _arch_major(arch: str) -> int | None:
    try:
        return int(arch.removeprefix("sm")) // 10
    except (ValueError, AttributeError):
        return None


@invariant("C1", "contract", "trainer quantizer = declared recipe",
           "the trainer's FP8 weights are the declared recipe (scale format, amax epsilon, block shape) applied to "
           "its weights: TE's quantizer of the BF16 parameter, or of the fp32 master with fp8_param",
           needs=("trainer", "master"),
           source="fp8check's own (harness/formats: Transformer Engine's quantizer, bit-exact to "
                  "compute_scale_from_amax)",
           why="The trainer's FP8 bytes are the reference every sync check compares against; if they are not the "
               "declared recipe applied to the weights, the config describes another trainer. Fix the scale-format / "
               "epsilon settings the trainer runs with.",
           periodic=True)       # quantizes every master weight again: a pass over twice the payload's bytes
def c1_recipe(ctx: CheckContext, screen: ScreenMode | None = None, fused: bool | None = None):
    """`screen`: how the comparisons' flags reach the host (harness.bitview.ScreenMode; None: production's
    BY_DEVICE). `fused`: which masters take the fused requantize-and-compare kernel (`_fused_flags`; None:
    production's, those on a GPU). The findings are the same under every choice of either."""
    import torch
    cfg, out, n = ctx.config, [], 0
    if cfg.delayed_scaling is not None:
        return [unknown("C1", "trainer.precision=fp8-delayed: a delayed-scaling scale comes from the learner's amax "
                              "history, not from the master it quantizes; nothing to recompute")]
    from fp8check.harness.bitview import ScreenMode, any_of, differs
    screen = screen or ScreenMode.BY_DEVICE

    joint = _split_blocks(cfg)

    def requantized(name):
        if name in joint:             # a split member sharing its block rows: quantized with its neighbours
            return _joint_requantized(ctx, joint[name])
        m = ctx.master[name]        # the same values as through fp32, without an fp32 copy of a BF16 master
        return cfg.recipe.quantize_weight(m.float() if cfg.trainer.fp8_param else m.to(torch.bfloat16))

    def mismatch(out, name, kept):
        q, s = kept or requantized(name)
        for what, exp, got in (("codes", q, ctx.trainer[name]), ("scale_inv", s, ctx.trainer.get(scale_name(name)))):
            ev = bit_diff(exp, got) if got is not None else None
            if ev:
                return fail("C1", name if what == "codes" else scale_name(name),
                            f"trainer {what} are not recipe {cfg.recipe.name!r} applied to the master "
                            f"(scale format or amax epsilon differs from what the config declares)", **ev)
        return None
    # every tensor's flag first (on a GPU: one host round trip for all, and no re-quantized copy kept: a flagged
    # tensor is quantized again for its evidence), then the evidence where one is set; a flag known at once (the
    # CPU) keeps its tensors, and the walk stops when the finding cap is certain
    by_kernel = _fused_flags(ctx, fused)  # on a GPU: every tensor's flag from one pass over the masters
    # every FP8 weight C1 cannot check is named (UNKNOWN), never skipped: one missing from either snapshot, or
    # whose scale_inv the trainer lacks (its codes are still checked)
    absent = [(n, [s for s, snap in (("master", ctx.master), ("trainer", ctx.trainer)) if n not in snap])
              for n in sorted(cfg.trainer_fp8_tensors)]
    unchecked = [unknown("C1", f"not checked: the {' and the '.join(w)} snapshot lacks it", tensor=n)
                 for n, w in absent if w]
    unchecked += [unknown("C1", f"scale not checked: the trainer snapshot lacks {scale_name(n)}", tensor=scale_name(n))
                  for n, w in absent if not w and scale_name(n) not in ctx.trainer]
    if len(unchecked) > 20:               # one line each for the first; the rest named in one finding's evidence
        rest = [f.tensor for f in unchecked[19:]]
        unchecked = unchecked[:19] + [unknown("C1", f"and {len(rest)} more FP8 tensors not checked (listed in "
                                                    "`unchecked`)", tensor=rest[0], unchecked=rest)]
    steps, known = [], 0
    for name in sorted(cfg.trainer_fp8_tensors):
        if known >= 10:
            break
        if name not in ctx.master or name not in ctx.trainer:
            continue
        shape = tuple(ctx.master[name].shape)
        if shape != tuple(cfg.layout.hf_shapes[name]):
            steps.append(unknown("C1", f"master has shape {list(shape)}, the model needs "
                                       f"{list(cfg.layout.hf_shapes[name])}", tensor=name))
            known += 1
            continue
        if name in joint and any(m not in ctx.master for m, _ in joint[name][1]):
            continue
        if name in by_kernel and name not in joint:
            steps.append((by_kernel[name], partial(mismatch, name=name, kept=None)))
            n += 1
            continue
        q, s = requantized(name)
        got_s = ctx.trainer.get(scale_name(name))
        hit = any_of(differs(q, ctx.trainer[name], screen),
                     differs(s, got_s, screen) if got_s is not None else False)
        steps.append((hit, partial(mismatch, name=name, kept=(q, s) if hit is True else None)))
        known += hit is True                # one finding each
        n += 1
    screened(steps, out, limit=10)
    if not out and not n:
        return [unknown("C1", "nothing to check: no FP8 weight is in both the master and the trainer snapshot")] + \
            unchecked
    if unchecked:
        return out + unchecked
    return out or [passed("C1", f"{n} tensors reproduce under {cfg.recipe.name}")]


def _split_blocks(cfg) -> dict:
    """Split member (`SyncConfig.split_tensors`) -> (itself, [(member, rows)] in the trainer's row order): the
    members of one fused GEMM whose rows share a block row in the trainer's tensor (Qwen3.5's GDN b|a, the tail of
    the fused in_proj), where they start on a block boundary and run to the tensor's end, so that quantizing them
    together is what Transformer Engine did to those block rows."""
    if not cfg.split_tensors or cfg.recipe.granularity != Granularity.BLOCK:
        return {}
    bn = cfg.recipe.block_shape[0]
    out = {}
    for gemm, members in cfg.trainer_splits.items():
        rows = sorted((p.src_row, p.rows, p.dst) for p in cfg.layout.megatron if p.src == gemm and p.dst in members)
        contiguous = all(a[0] + a[1] == b[0] for a, b in zip(rows, rows[1:]))
        if rows and contiguous and rows[0][0] % bn == 0 and rows[-1][0] + rows[-1][1] == \
                cfg.layout.megatron_shapes[gemm][0]:
            group = [(dst, n) for _, n, dst in rows]
            for _, _, dst in rows:
                out[dst] = (dst, group)
    return out


def _joint_requantized(ctx: CheckContext, entry):
    """The recipe applied to a split member's block rows as the trainer quantized them (its group's masters
    stacked): the member's codes and the scale rows of the blocks it lies in."""
    import torch
    cfg, (name, group) = ctx.config, entry
    bn = cfg.recipe.block_shape[0]
    stacked = torch.cat([ctx.master[m].float() if cfg.trainer.fp8_param else ctx.master[m].to(torch.bfloat16)
                         for m, _ in group])
    q, s = cfg.recipe.quantize_weight(stacked)
    off = 0
    for m, rows in group:
        if m == name:
            return q[off:off + rows], s[off // bn: -(-(off + rows) // bn)]
        off += rows
    raise KeyError(name)


def _fused_flags(ctx: CheckContext, fused: bool | None = None) -> dict:
    """FP8 weight -> C1's flag from the fused requantize-and-compare kernel (harness.formats.triton_requantize: each
    master read once, quantized in registers by the quantizer's own rounding, compared with the trainer's codes and
    scale_inv, nothing written but a flag), with Triton at hand; {} elsewhere (the quantize-then-compare path,
    whose bytes the kernel equals). `fused`: None (production) takes the masters on a GPU; True every master, a
    CPU one through Triton's interpreter (the kernel's code on the CPU suite); False none."""
    import torch
    cfg = ctx.config
    if cfg.recipe.granularity != Granularity.BLOCK:
        return {}
    names = [n for n in sorted(cfg.trainer_fp8_tensors) if n in ctx.master and n in ctx.trainer
             and (ctx.master[n].is_cuda if fused is None else fused)
             and tuple(ctx.master[n].shape) == tuple(cfg.layout.hf_shapes[n])]
    if not names:
        return {}
    try:
        from fp8check.harness.formats import triton_requantize
        if triton_requantize.triton is None:
            return {}
        r = cfg.recipe
        want = torch.float32 if cfg.trainer.fp8_param else torch.bfloat16
        flags, batch, made = [], [], 0

        def run():
            flags.extend(triton_requantize.requantize_mismatch(
                [m for _, m in batch], [ctx.trainer[n] for n, _ in batch],
                [ctx.trainer.get(scale_name(n)) for n, _ in batch], tuple(r.block_shape), pow2=r.pow2,
                amax_epsilon=r.amax_epsilon, fp8_dtype=r.fp8_dtype).unbind())
        for i, n in enumerate(names):
            # the dtype C1 quantizes (BF16, or the fp32 master with fp8_param): the bytes depend on it; a cast copy
            # is held for a bounded batch only
            m = ctx.master[n]
            if m.dtype != want:
                m = m.to(want)
                made += m.numel() * m.element_size()
            batch.append((n, m))
            if made >= CAST_BATCH_BYTES or i == len(names) - 1:
                run()
                batch, made = [], 0
    except (ImportError, ValueError, TypeError):
        return {}                   # inputs the kernel refuses: the per-tensor path judges them
    return dict(zip(names, flags))


CAST_BATCH_BYTES = 256 << 20


@invariant("C2", "contract", "FP32 scales survive the engine",
           "FP32 block scales need VLLM_USE_DEEP_GEMM_E8M0=0 (or DeepGEMM off): vLLM's default on Hopper "
           "requantizes every block-FP8 weight to UE8M0 after loading", live=False,
           source="SkyRL skyrl/train/utils/utils.py:960-967 (FP32 block scales require VLLM_USE_DEEP_GEMM_E8M0=0); "
                  "vLLM 0.26 vllm/envs.py:1480-1487 (DeepGEMM and E8M0 on by default) and "
                  "vllm/utils/deep_gemm.py:700-719 (eligible layers requantized to UE8M0); verl never pins it "
                  "(1dda039b); NeMo RL pins it only with use_deep_gemm: true (quantization/fp8.py:240-242)",
           why="vLLM 0.26 requantizes every DeepGEMM-eligible block-FP8 weight (N%64, K%128) to power-of-two UE8M0 "
               "scales after loading: FP32 scales and the codes under them change. Set VLLM_USE_DEEP_GEMM_E8M0=0 for "
               "the rollout workers (or VLLM_USE_DEEP_GEMM=0).",
           backstop="fp32_scales_through_e8m0")
def c2_e8m0(ctx: CheckContext):
    cfg = ctx.config
    if cfg.recipe.scale_format == ScaleFormat.FP32 and cfg.requant_ue8m0:
        return [fail("C2", None, "blockwise FP32 scales with VLLM_USE_DEEP_GEMM=1 and VLLM_USE_DEEP_GEMM_E8M0=1: "
                     "the engine rewrites scales and codes; set VLLM_USE_DEEP_GEMM_E8M0=0",
                     key="rollout.deep_gemm_e8m0")]
    return []


@invariant("C3", "contract", "Blackwell needs power-of-two scales",
           "on sm100+ blockwise FP8 runs through MXFP8-style kernels: scales must be powers of two (pow2 / e8m0)",
           live=False,
           source="SkyRL 0.4.0 skyrl/train/utils/utils.py:1074-1078, 1110 (power-of-two scales are the only "
                  "blockwise mode TE supports on SM100+: it emulates Float8BlockScaling on the MX datapath); verl issue "
                  "#6172 (FP8 E2E with FP32 scales fails on Blackwell)",
           why="On Blackwell, Transformer Engine's blockwise recipe runs with power-of-two scales whatever the "
               "variable says, and DeepGEMM there takes E8M0 scale factors only. Set "
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0, or use mxfp8.")
def c3_blackwell(ctx: CheckContext):
    cfg, major = ctx.config, _arch_major(ctx.config.arch)
    if major is None:
        return [unknown("C3", f"gpu_arch {cfg.gpu_arch!r} not understood (expected smNN or auto)")]
    if major >= 10 and cfg.recipe.scale_format == ScaleFormat.FP32:
        return [fail("C3", None, f"{cfg.arch} with FP32 block scales; use recipe blockwise-pow2 "
                     "(NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0) or mxfp8", key="recipe")]
    return []


@invariant("C4", "contract", "persistent FP8 parameters need FP32 block scales",
           "fp8_param (persistent FP8 weights) needs FP32 block scales and is not available with MXFP8", live=False,
           source=skyrl_source("pow2-scales-fp8-param", "mxfp8-fp8-param") + " (persistent fp8_param requires FP32 "
                  "block scales; refused with mxfp8: TE 2.11 replace_raw_data raises; Megatron's "
                  "reuse_grad_buf_for_mxfp8_param_ag fallback zeroes freshly loaded params); NeMo RL allows mxfp8 + "
                  "fp8_param (see E6)",
           why="Persistent FP8 parameters are re-quantized from the FP32 master each step with FP32 block scales; "
               "with power-of-two scales, or with MXFP8 storage, the path is not available (SkyRL refuses both). Use "
               "fp8_param=false, or FP32 scales on Hopper.")
def c4_fp8_param(ctx: CheckContext):
    cfg = ctx.config
    if not cfg.trainer.fp8_param:
        return []
    if cfg.recipe.granularity == Granularity.MXFP8:
        return [fail("C4", None, "fp8_param is not available with the mxfp8 recipe" +
                     _skyrl_says(ctx, "mxfp8-fp8-param"), key="trainer.fp8_param")]
    if cfg.trainer_recipe.scale_format != ScaleFormat.FP32:
        return [fail("C4", None, "fp8_param with power-of-two block scales; set NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1" +
                     _skyrl_says(ctx, "pow2-scales-fp8-param"), key="trainer.fp8_param")]
    return []


@invariant("C5", "contract", "MXFP8 needs sm100",
           "the mxfp8 recipe (1x32 blocks, E8M0 scales) needs Blackwell (sm100+) kernels", live=False,
           source=skyrl_source("mxfp8-pre-blackwell") + " ('fp8_recipe=mxfp8 requires SM100+')",
           why="Transformer Engine's MXFP8BlockScaling has no kernel path below Blackwell. Use blockwise on Hopper "
               "(or fp8_recipe=auto).")
def c5_mxfp8(ctx: CheckContext):
    cfg, major = ctx.config, _arch_major(ctx.config.arch)
    if cfg.recipe.granularity == Granularity.MXFP8 and major is not None and major < 10:
        return [fail("C5", None, f"mxfp8 on {cfg.arch}: no MXFP8 GEMMs below sm100; use blockwise-fp32 on "
                     "Hopper" + _skyrl_says(ctx, "mxfp8-pre-blackwell"), key="recipe")]
    return []


@invariant("C6", "contract", "scale format and amax epsilon agree",
           "trainer, sender and engine use one scale format and one amax epsilon (Transformer Engine defaults to "
           "power-of-two block scales, other stacks to FP32: the same value must reach all three)", live=False,
           source="fp8check's own; Transformer Engine defaults to power-of-two block scales "
                  "(common/recipe/__init__.py:429), SkyRL's serializer to FP32 when unset "
                  "(weight_sync/fp8/quantize.py:20-33), verl's rollout quantizer is FP32 only",
           why="The trainer, the sender and the engine each default the scale format their own way; when the "
               "trainer's differs from what the rollout serves, every weight's scales and codes differ. Export one "
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES to every worker (and, in NeMo RL, match "
               "pow2_weight_scaling_factors).")
def c6_agree(ctx: CheckContext):
    cfg, out = ctx.config, []
    t = cfg.trainer_recipe
    if t.scale_format != cfg.recipe.scale_format:
        out.append(fail("C6", None, f"trainer scale format {t.scale_format} (NVTE_FP8_BLOCK_SCALING_FP32_SCALES) "
                        f"!= recipe {cfg.recipe.scale_format}", key="trainer.scale_format"))
    if t.amax_epsilon != cfg.recipe.amax_epsilon:
        out.append(fail("C6", None, f"trainer amax epsilon {t.amax_epsilon:g} != recipe {cfg.recipe.amax_epsilon:g}",
                        key="trainer.amax_epsilon"))
    return out


@invariant("C7", "contract", "block shape agrees",
           "the engine's weight_block_size equals the recipe's weight block shape", live=False,
           source="SkyRL skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py:36-46 and "
                  "inference_servers/utils.py:98-111 (weight_block_size [128, 128], validated); verl "
                  "vllm_async_server.py:1071-1088 and NeMo RL quantization/fp8.py:37-42 inject [128, 128]",
           why="The engine dequantizes with its configured block; scales computed on another block shape are applied "
               "to the wrong elements. Remove the weight_block_size override.")
def c7_block(ctx: CheckContext):
    cfg = ctx.config
    b = cfg.rollout.weight_block_size
    if b is not None and tuple(b) != tuple(cfg.recipe.block_shape):
        return [fail("C7", None, f"engine weight_block_size {list(b)} != recipe block {list(cfg.recipe.block_shape)}",
                     key="rollout.weight_block_size")]
    return []


@invariant("C8", "contract", "adapter-only LoRA cannot sync serialized FP8",
           "serialized FP8 weight sync needs full-weight updates: adapter-only LoRA (merge off) must sync BF16 "
           "adapters instead", live=False,
           source=skyrl_source("unmerged-lora") + " ('FP8 weight sync requires full-weight updates; Megatron LoRA "
                  "with merge_lora=false syncs adapters only')",
           why="Adapter-only LoRA sends BF16 adapters, not the merged FP8 weights the engine serves. Set "
               "lora_config.merge_lora=true, or turn off FP8 weight sync.")
def c8_lora(ctx: CheckContext):
    cfg = ctx.config
    if cfg.lora_adapter_only and cfg.sync_mode == "onpolicy":
        return [fail("C8", None, f"LoRA rank {cfg.lora_rank} with adapter-only sync and serialized FP8 weight sync" +
                     _skyrl_says(ctx, "unmerged-lora"), key="lora")]
    return []


def _both_block_activations(cfg) -> bool:
    """Both the learner and the engine quantize activations on blocks (the condition C9's pairing exists in)."""
    return (cfg.recipe.granularity == Granularity.BLOCK and cfg.trainer_recipe.granularity == Granularity.BLOCK
            and cfg.trainer_fp8
            and cfg.engine_recipe.granularity == Granularity.BLOCK and bool(cfg.engine_fp8_tensors))


@invariant("C9", "contract", "activation scale format agrees",
           "the engine quantizes activations with the trainer's scale format: power-of-two block scales pair with "
           "vLLM's DeepGEMM E8M0 path (UE8M0 activation scales), FP32 scales with it off", live=False,
           source="fp8check's own; vLLM 0.26 DeepGEMM E8M0 mode rounds activation scales to UE8M0 "
                  "(vllm/envs.py:1485-1487)",
           why="Identical weights still give other log-probs when the engine quantizes activations with another scale"
               " format than the trainer. Pair power-of-two scales with E8M0 on, FP32 scales with it off.",
           applies=lambda cfg: _both_block_activations(cfg))
def c9_activations(ctx: CheckContext):
    cfg = ctx.config
    trainer_pow2 = cfg.trainer_recipe.scale_format == ScaleFormat.POW2
    engine_pow2 = cfg.requant_ue8m0
    if trainer_pow2 != engine_pow2:
        t = "power-of-two" if trainer_pow2 else "FP32"
        e = "UE8M0 (power-of-two)" if engine_pow2 else "FP32"
        fix = "VLLM_USE_DEEP_GEMM=1 VLLM_USE_DEEP_GEMM_E8M0=1" if trainer_pow2 else "VLLM_USE_DEEP_GEMM_E8M0=0"
        return [fail("C9", None, f"trainer activation scales are {t}, the engine's are {e}: log-probs drift even "
                     f"with identical weights; set {fix}", key="rollout.deep_gemm_e8m0")]
    return []


# the engine setting -> what to change, named the way a user sets it
_SETTING_FIX = {
    "method": "start the engine from a block-FP8 checkpoint config (config.json quantization_config with "
              "weight_block_size, as harness.engines.vllm.write_model_dir writes it), not quantization='fp8' / "
              "'fp8_per_block' on a BF16 checkpoint: an engine that quantizes BF16 itself cannot install the "
              "learner's bytes as they are",
    "weight_block_size": "set quantization_config.weight_block_size to the recipe's block shape",
    "kv_cache_dtype": "start vllm.LLM with the config's kv_cache_dtype",
    "ue8m0_requant": "set VLLM_USE_DEEP_GEMM_E8M0 (and VLLM_USE_DEEP_GEMM) in the rollout workers' environment "
                     "as harness.engines.vllm.engine_env(config) gives them",
}


@invariant("C10", "contract", "the engine runs the config's settings",
           "the settings read from the running engine -- quantization method, weight block size, KV-cache dtype, "
           "DeepGEMM UE8M0 requantization -- are the ones the config resolves", needs=("rollout",),
           source="fp8check's own; vLLM 0.26 vllm/envs.py:1480-1487 (DeepGEMM and E8M0 on by default: an engine "
                  "started without the config's environment requantizes FP32 block scales), "
                  "vllm/model_executor/layers/quantization/online/fp8.py (quantization='fp8' on a BF16 checkpoint "
                  "quantizes per tensor itself)",
           why="Every other check judges the engine against what it declares it does; a setting the job's config "
               "did not plan (vLLM's default E8M0 on Hopper, an online-quantizing engine, another KV-cache dtype) "
               "changes the policy while the bytes stay consistent with the engine's own rule. Name the variable.")
def c10_engine_settings(ctx: CheckContext):
    from fp8check.harness.numerics.settings import config_settings
    got = dict(ctx.rollout.meta.settings or {})
    if not got:
        return [unknown("C10", "the engine record carries no settings read from the engine")]
    want = config_settings(ctx.config)
    out, compared = [], 0
    for key in ("method", "weight_block_size", "kv_cache_dtype", "ue8m0_requant"):
        if key not in got or got[key] is None and key != "weight_block_size":
            continue                      # the engine did not say: nothing claimed
        compared += 1
        if got[key] != want[key]:
            env = ""
            if key == "ue8m0_requant":
                env = (f" (the engine resolved VLLM_USE_DEEP_GEMM={int(bool(got.get('VLLM_USE_DEEP_GEMM')))}, "
                       f"VLLM_USE_DEEP_GEMM_E8M0={int(bool(got.get('VLLM_USE_DEEP_GEMM_E8M0')))}; the config "
                       f"needs VLLM_USE_DEEP_GEMM_E8M0={int(want['VLLM_USE_DEEP_GEMM_E8M0'])})")
            out.append(fail("C10", key, f"engine {key} is {got[key]!r}, the config's is {want[key]!r}{env}: "
                                        f"{_SETTING_FIX[key]}", stage="config", expected=want[key], actual=got[key]))
    if not out and not compared:
        return [unknown("C10", "the engine record's settings name none of method, weight_block_size, "
                               "kv_cache_dtype, ue8m0_requant")]
    return out or [passed("C10", "engine settings read from the engine match the config"
                          if got.get("read_from_engine") else "engine settings match the config")]
