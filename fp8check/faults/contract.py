"""Contract and alignment faults: configurations the C and A rules must reject before a job starts."""
from __future__ import annotations

from dataclasses import replace

from fp8check.harness.formats import get_recipe
from fp8check.harness.kinds import Granularity, ScaleFormat
from fp8check.harness.layouts.vllm import tp_split_dim

from .base import Fault, NoTarget, register, with_config as cfg, with_rollout as rollout, with_trainer as trainer


register(Fault("blackwell_with_fp32_scales", "contract", "config", ("C3",), "blockwise FP32 scales on sm100",
               cfg(gpu_arch="sm100"), applies=lambda c: c.recipe.scale_format is ScaleFormat.FP32))
register(Fault("fp8_param_with_pow2_scales", "contract", "config", ("C4",),
               "persistent FP8 parameters with power-of-two block scales", trainer(fp8_param=True),
               applies=lambda c: c.recipe.scale_format is ScaleFormat.POW2))
register(Fault("fp8_param_with_mxfp8", "contract", "config", ("C4",), "persistent FP8 parameters with MXFP8",
               trainer(fp8_param=True), applies=lambda c: c.recipe.granularity is Granularity.MXFP8))
register(Fault("mxfp8_on_hopper", "contract", "config", ("C5",), "the mxfp8 recipe on sm90",
               lambda c: replace(c, recipe=get_recipe("mxfp8"), gpu_arch="sm90"),
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK))
register(Fault("engine_block_shape_mismatch", "contract", "config", ("C7",),
               "engine weight_block_size [128, 64] vs the recipe's [128, 128]", rollout(weight_block_size=(128, 64)),
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK))
register(Fault("lora_adapter_only_fp8_sync", "contract", "config", ("C8",),
               "adapter-only LoRA (merge off) with serialized FP8 weight sync", cfg(lora_rank=16, lora_merge=False)))
# P1 does not see it by design: its floor runs the engine's declared activation quantizer (the difference C9 names)
register(Fault("pow2_scales_fp32_activations", "contract", "config", ("C9",),
               "power-of-two weight scales with VLLM_USE_DEEP_GEMM_E8M0=0: the engine quantizes activations with "
               "FP32 scales, the trainer with powers of two", rollout(deep_gemm_e8m0=False),
               applies=lambda c: c.recipe.scale_format is ScaleFormat.POW2))


def _engine_e8m0_flipped(c, index=0):
    """The engine process started without the config's VLLM_USE_DEEP_GEMM_E8M0 (a user's own vllm.LLM, where
    vLLM 0.26's default is on): it runs -- and declares -- the other UE8M0 mode."""
    from fp8check.harness.engines.cpu.rollout import ReferenceRollout
    return ReferenceRollout(replace(c, rollout=replace(c.rollout, use_deep_gemm=True,
                                                       deep_gemm_e8m0=not c.requant_ue8m0)))


# the engine is consistent with itself (it does the transform it declares): with power-of-two scales the bytes
# are the learner's and only the settings read from the engine show that its activations run on another grid;
# with FP32 scales the UE8M0 requantization also changes weight values (S3, S4)
register(Fault("engine_e8m0_unpinned", "contract", "engine", ("C10",),
               "the rollout engine runs the other DeepGEMM E8M0 mode than the config resolves (started without "
               "engine_env(config): FP32 block scales requantized to UE8M0, or power-of-two scales with FP32 "
               "activation scales)", _engine_e8m0_flipped, may=("S3", "S4"),
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK))
MAX_TP = 64         # beyond this no job runs one tensor-parallel group


def block_breaking_tp(c) -> int:
    """The smallest power-of-two rollout TP that splits some FP8 projection into shards that are not whole
    blocks (128 rows, or the recipe's K block for row-parallel inputs): TP 8 on tiny-dense's 512-wide
    projections, TP 16 on Qwen3-8B's 1024-row k/v projections; NoTarget when no TP up to MAX_TP does
    (MXFP8's 1x32 blocks on Qwen3-8B)."""
    bn, bk = c.recipe.block_shape
    dims = [(t.shape[tp_split_dim(t.module)], bk if tp_split_dim(t.module) else bn)
            for t in c.spec.tensors() if t.name in c.fp8_tensors]
    tp = 2
    while tp <= MAX_TP:
        if any(d % tp or (d // tp) % b for d, b in dims):
            return tp
        tp *= 2
    raise NoTarget(f"no tensor parallelism up to {MAX_TP} splits an FP8 projection of {c.model} off the "
                      f"{c.recipe.name} block grid")


def _break_blocks(c):
    return replace(c, rollout=replace(c.rollout, tp_size=block_breaking_tp(c)))


# where the engines can be built at that TP, the mirror loads what such a shard's scale rows map to: nothing, so the
# poisoned tile survives (S1) and the module never completes (S7); where they cannot (a vocabulary that does not
# split), only the static rules run
register(Fault("tp_breaks_block_divisibility", "alignment", "config", ("A2",),
               "rollout tensor parallelism that splits FP8 projections into shards narrower than a block (the smallest "
               "such power of two: TP 8 on the tiny models' 512-wide projections, 16 on Qwen3-8B's k/v)",
               _break_blocks, applies=lambda c: all(t == "full_attention" for t in c.spec.layer_types),
               may=("S1", "S7")))
register(Fault("packing_rule_mismatch", "alignment", "config", ("A3",),
               "replay pads packed sequences to a multiple of 8 while collation uses the TP/CP/FP8 rule",
               lambda c: replace(c, packing=replace(c.packing, replay_multiple=8))))
register(Fault("trainer_cp_packing_mismatch", "alignment", "config", ("A3",),
               "trainer TP=4, CP=4 (tokens in 2*CP chunks per TP rank: a multiple of 32) while preprocessing "
               "still pads to the FP8 multiple 16", lambda c: replace(c, trainer=replace(c.trainer, tp_size=4, cp_size=4),
                                                                   packing=replace(c.packing, preprocess_multiple=16)),
               may=("A2",),    # trainer TP 4 also splits the MoE / hybrid models' narrower projections off the grid
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK))


def _shared_expert_tp(c):
    return replace(c, rollout=replace(c.rollout, tp_size=8))


# vllm#52915: vLLM 0.26 lets a merged column-parallel layer (the shared expert's gate|up) run with shards
# narrower than the block and loads the scale tile two ranks share wrong; the configuration itself is the bug
register(Fault("shared_expert_shard_below_block", "alignment", "config", ("A2",),
               "rollout TP 8 splits the shared expert's gate|up into 64-row shards, below the 128-row block: ranks "
               "share a scale tile", _shared_expert_tp,
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK and c.spec.is_moe
               and 0 < c.spec.shared_expert_intermediate_size // 8 < c.recipe.block_shape[0], may=("S1", "S7")))
