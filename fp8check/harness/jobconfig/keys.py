"""The job keys fp8check reads, per stack, with the kind of value each takes: the one list the reader, the
type checks, the unknown-key rule (K1) and the parser fuzz all derive from.

SkyRL: skyrl/train/config/config.py of SkyRL 0.4.0, the PyPI wheel (FP8 sync PR #1898 + MXFP8 #2072).
verl: verl/trainer/config/_generated_ppo_megatron_trainer.yaml, verl/workers/config/rollout.py at 1dda039b.
NeMo RL: nemo_rl/models/policy/__init__.py (Fp8Config), nemo_rl/models/generation/vllm/config.py
(VllmSpecificArgs) and the keys nemo_rl/models/generation/vllm/quantization/fp8.py reads with .get(), at 7ea279ab.
"""
from __future__ import annotations

SKYRL_MEGATRON = "trainer.policy.megatron_config."
SKYRL_REF_MEGATRON = "trainer.ref.megatron_config."
SKYRL_TCK = SKYRL_MEGATRON + "transformer_config_kwargs."
SKYRL_REF_TCK = SKYRL_REF_MEGATRON + "transformer_config_kwargs."
SKYRL_ENGINE = "generator.inference_engine."
SKYRL_EIK = SKYRL_ENGINE + "engine_init_kwargs."
SKYRL_QCFG = SKYRL_EIK + "hf_overrides.quantization_config."
VERL_MEGATRON = "actor_rollout_ref.actor.megatron."
VERL_TC = VERL_MEGATRON + "override_transformer_config."
VERL_ROLLOUT = "actor_rollout_ref.rollout."
VERL_VLLM_KWARGS = VERL_ROLLOUT + "engine_kwargs.vllm."
VERL_RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars."
NEMO_POLICY = "policy."
NEMO_GEN = "policy.generation."
NEMO_VLLM = "policy.generation.vllm_cfg."
NEMO_MEGATRON = "policy.megatron_cfg."
NEMO_FP8 = NEMO_MEGATRON + "fp8_cfg."
NEMO_DDP = NEMO_MEGATRON + "distributed_data_parallel_config."

# kinds: bool int str num list strlist dict any; fp8 = Megatron's fp8 (a format name, or SkyRL's "off" spellings)
_SKYRL_TRAINER = {
    "fp8": "fp8", "fp8_recipe": "str", "fp8_param": "bool", "fp8_amax_compute_algo": "str",
}
SKYRL_KEYS = {
    **{SKYRL_MEGATRON + k: v for k, v in _SKYRL_TRAINER.items()},
    **{SKYRL_TCK + k: v for k, v in _SKYRL_TRAINER.items()},
    SKYRL_TCK + "tp_only_amax_red": "bool",
    **{SKYRL_REF_MEGATRON + k: v for k, v in _SKYRL_TRAINER.items()},
    **{SKYRL_REF_TCK + k: v for k, v in _SKYRL_TRAINER.items()},
    SKYRL_MEGATRON + "ddp_config.fp8_param_gather": "bool",
    SKYRL_MEGATRON + "ddp_config.overlap_grad_reduce": "bool",
    SKYRL_MEGATRON + "ddp_config.overlap_param_gather": "bool",
    SKYRL_MEGATRON + "tensor_model_parallel_size": "int", SKYRL_MEGATRON + "pipeline_model_parallel_size": "int",
    SKYRL_MEGATRON + "context_parallel_size": "int", SKYRL_MEGATRON + "expert_model_parallel_size": "int",
    SKYRL_MEGATRON + "expert_tensor_parallel_size": "int", SKYRL_MEGATRON + "lora_config.merge_lora": "bool",
    "trainer.policy.inference_only_init": "bool",
    "trainer.policy.model.path": "str", "trainer.ref.model.path": "str", "trainer.policy.model.lora.rank": "int",
    "trainer.strategy": "str",
    "trainer.algorithm.use_kl_loss": "bool", "trainer.algorithm.use_kl_in_reward": "bool",
    "trainer.algorithm.off_policy_correction.tis_ratio_type": "str", "trainer.algorithm.use_tis": "bool",
    "trainer.fully_async.enabled": "bool", "trainer.fully_async.clear_kv_cache_on_weight_sync": "bool",
    "trainer.mtp.enabled": "bool",
    SKYRL_ENGINE + "fp8_weight_sync_mode": "str", SKYRL_ENGINE + "tensor_parallel_size": "int",
    SKYRL_ENGINE + "expert_parallel_size": "int", SKYRL_ENGINE + "pipeline_parallel_size": "int",
    SKYRL_ENGINE + "data_parallel_size": "int", SKYRL_ENGINE + "model_dtype": "str",
    SKYRL_ENGINE + "backend": "str", SKYRL_ENGINE + "weight_sync_backend": "str",
    SKYRL_ENGINE + "enable_prefix_caching": "bool",
    SKYRL_EIK + "quantization": "str", SKYRL_EIK + "kv_cache_dtype": "str", SKYRL_EIK + "load_format": "str",
    SKYRL_EIK + "hf_overrides": "dict",
    SKYRL_QCFG + "weight_block_size": "list", SKYRL_QCFG + "ignored_layers": "strlist", SKYRL_QCFG + "ignore": "strlist",
    SKYRL_QCFG + "quant_method": "str", SKYRL_QCFG + "activation_scheme": "str", SKYRL_QCFG + "fmt": "str",
    SKYRL_QCFG + "format": "str",
}
VERL_KEYS = {
    VERL_TC + "fp8": "fp8", VERL_TC + "fp8_recipe": "str", VERL_TC + "fp8_param": "bool",
    "actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe": "str",
    VERL_MEGATRON + "tensor_model_parallel_size": "int", VERL_MEGATRON + "context_parallel_size": "int",
    VERL_MEGATRON + "pipeline_model_parallel_size": "int", VERL_MEGATRON + "expert_model_parallel_size": "int",
    "actor_rollout_ref.actor.strategy": "str",
    VERL_ROLLOUT + "name": "str", VERL_ROLLOUT + "quantization": "str", VERL_ROLLOUT + "quantization_config_file": "str",
    VERL_ROLLOUT + "tensor_model_parallel_size": "int", VERL_ROLLOUT + "load_format": "str",
    VERL_ROLLOUT + "enable_prefix_caching": "bool",
    "actor_rollout_ref.model.path": "str", "actor_rollout_ref.model.lora_rank": "int",
    "actor_rollout_ref.model.lora.merge": "bool",
    "algorithm.rollout_correction.rollout_is": "str",
}
NEMO_KEYS = {
    "policy.model_name": "str", "policy.precision": "str", "policy.make_sequence_length_divisible_by": "int",
    "policy.sequence_packing.enabled": "bool", "policy.dtensor_cfg.enabled": "bool",
    "policy.dtensor_cfg.tensor_parallel_size": "int",
    NEMO_GEN + "backend": "str",
    NEMO_VLLM + "precision": "str", NEMO_VLLM + "kv_cache_dtype": "str", NEMO_VLLM + "is_mx": "bool",
    NEMO_VLLM + "use_deep_gemm": "bool", NEMO_VLLM + "num_first_layers_in_bf16": "int",
    NEMO_VLLM + "num_last_layers_in_bf16": "int", NEMO_VLLM + "pow2_weight_scaling_factors": "bool",
    NEMO_VLLM + "pow2_activation_scaling_factors": "bool", NEMO_VLLM + "quantization_ignored_layer_kws": "strlist",
    NEMO_VLLM + "async_engine": "bool", NEMO_VLLM + "tensor_parallel_size": "int",
    NEMO_VLLM + "expert_parallel_size": "int", NEMO_VLLM + "pipeline_parallel_size": "int",
    NEMO_VLLM + "load_format": "str", NEMO_VLLM + "env_vars": "dict",
    NEMO_MEGATRON + "enabled": "bool", NEMO_MEGATRON + "tensor_model_parallel_size": "int",
    NEMO_MEGATRON + "pipeline_model_parallel_size": "int", NEMO_MEGATRON + "context_parallel_size": "int",
    NEMO_MEGATRON + "sequence_parallel": "bool", NEMO_MEGATRON + "env_vars": "dict",
    NEMO_MEGATRON + "first_last_layers_bf16": "bool", NEMO_MEGATRON + "num_layers_at_start_in_bf16": "int",
    NEMO_MEGATRON + "num_layers_at_end_in_bf16": "int",
    NEMO_DDP + "overlap_grad_reduce": "bool", NEMO_DDP + "overlap_param_gather": "bool",
    NEMO_FP8 + "enabled": "bool", NEMO_FP8 + "fp8": "fp8", NEMO_FP8 + "fp8_recipe": "str",
    NEMO_FP8 + "fp8_param": "bool", NEMO_FP8 + "force_clear_fp8_caches": "bool",
    "loss_fn.use_importance_sampling_correction": "bool",
}
FP8CHECK_KEYS = {
    "fp8check.model": "str", "fp8check.exclude": "strlist", "fp8check.amax_epsilon": "num",
    "fp8check.packing.collate_multiple": "int", "fp8check.packing.preprocess_multiple": "int",
    "fp8check.packing.replay_multiple": "int", "fp8check.seed": "int",
}
KEY_KINDS: dict[str, str] = {**SKYRL_KEYS, **VERL_KEYS, **NEMO_KEYS, **FP8CHECK_KEYS}
KNOWN = frozenset(KEY_KINDS)

# subtrees whose keys are open-ended (any vLLM argument, any variable name, compressed-tensors groups)
OPEN_SUBTREES = (SKYRL_QCFG + "config_groups.", VERL_VLLM_KWARGS, VERL_RUNTIME_ENV, NEMO_VLLM + "env_vars.",
                 NEMO_MEGATRON + "env_vars.")
# per-process environment maps a job config carries: prefix -> which processes get them
ENV_MAPS = {NEMO_MEGATRON + "env_vars.": "trainer", NEMO_VLLM + "env_vars.": "rollout", VERL_RUNTIME_ENV: "all"}

# prefixes whose every key fp8check must understand (a typo here silently changes numerics, or nothing)
FP8_PREFIXES = (
    SKYRL_MEGATRON + "fp8", SKYRL_TCK + "fp8", SKYRL_REF_MEGATRON + "fp8", SKYRL_REF_TCK + "fp8",
    SKYRL_MEGATRON + "ddp_config.fp8", SKYRL_ENGINE + "fp8", SKYRL_EIK + "quantization", SKYRL_QCFG,
    VERL_TC + "fp8", VERL_ROLLOUT + "quantization", "actor_rollout_ref.actor.optim.override_optimizer_config.fp8",
    NEMO_FP8, NEMO_VLLM + "precision", NEMO_VLLM + "kv_cache", NEMO_VLLM + "is_mx", NEMO_VLLM + "use_deep",
    NEMO_VLLM + "use_weight", NEMO_VLLM + "use_activation", NEMO_VLLM + "pow2", NEMO_VLLM + "num_first",
    NEMO_VLLM + "num_last", NEMO_VLLM + "quantization", NEMO_VLLM + "fp8",
    "fp8check.",
)
# names a stack's docs once used for a key (a key read with .get(..., default) silently ignores them)
RENAMED = {
    # NeMo RL commit ad364966 (#2536): the docs named the pow2 switches after FP8Config's fields
    NEMO_VLLM + "use_weight_pow2_scale": NEMO_VLLM + "pow2_weight_scaling_factors",
    NEMO_VLLM + "use_activation_pow2_scale": NEMO_VLLM + "pow2_activation_scaling_factors",
}

# environment variables the FP8 contract reads (Transformer Engine 2.20.2, vLLM 0.26 vllm/envs.py)
ENV_KNOWN = ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "NVTE_FP8_BLOCK_AMAX_EPSILON", "NVTE_BACKWARD_OVERRIDE",
             "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "NVTE_FP8_DPA_BWD", "NVTE_FP8_COLLECTION_NAME",
             "NVTE_FP8_GEMM_HIGH_PRECISION_ACCUMULATION",
             "VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_MOE_USE_DEEP_GEMM",
             "VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES", "VLLM_DEEP_GEMM_WARMUP",
             "VERL_DISABLE_TRITON_FP8", "SKYRL_MX_CAST_BACKEND")
# variable-name prefixes where an unknown name is most likely a typo of one above
ENV_PREFIXES = ("NVTE_FP8", "VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VERL_DISABLE_TRITON")
# Transformer Engine evaluates these once, when transformer_engine.common.recipe is imported (class attributes of
# Float8BlockScaling / the recipes: TE 2.20.2 common/recipe/__init__.py:261, 312, 372, 429-443)
TE_IMPORT_TIME = ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "NVTE_BACKWARD_OVERRIDE")
