"""Each stack's own default for the keys fp8check reads, where the stack declares it: a key the job does not write
takes this value, and its provenance says so.

SkyRL: skyrl/train/config/config.py of SkyRL 0.4.0 (the PyPI wheel). verl: verl/trainer/config/rollout/rollout.yaml and
_generated_ppo_megatron_trainer.yaml at 1dda039b. NeMo RL: examples/configs/grpo_math_1B.yaml at 7ea279ab (the
base every NeMo RL recipe inherits through `defaults:`).
"""
from __future__ import annotations

from .keys import NEMO_DDP, NEMO_FP8, NEMO_MEGATRON, NEMO_VLLM, SKYRL_ENGINE, VERL_ROLLOUT

SKYRL_DEFAULTS = {
    "trainer.strategy": "fsdp",                                  # config.py:1466
    SKYRL_ENGINE + "backend": "vllm",                            # config.py:1217
    SKYRL_ENGINE + "weight_sync_backend": "nccl",                # config.py:1219
    SKYRL_ENGINE + "enable_prefix_caching": True,                # config.py:1246
    "trainer.fully_async.enabled": False,                        # config.py:1033
    "trainer.fully_async.clear_kv_cache_on_weight_sync": False,  # config.py:1047
    "trainer.algorithm.use_kl_loss": True,                       # config.py:914
    "trainer.algorithm.use_kl_in_reward": False,                 # config.py:911
    "trainer.policy.inference_only_init": False,                 # config.py:710
}
VERL_DEFAULTS = {
    VERL_ROLLOUT + "load_format": "dummy",                       # rollout.yaml:100
    VERL_ROLLOUT + "enable_prefix_caching": True,                # rollout.yaml:90
}
NEMO_DEFAULTS = {
    "policy.precision": "bfloat16",                              # grpo_math_1B.yaml:137
    "policy.dtensor_cfg.enabled": True,                          # :143
    "policy.dtensor_cfg.tensor_parallel_size": 1,                # :147
    "policy.make_sequence_length_divisible_by": "${policy.dtensor_cfg.tensor_parallel_size}",  # :341
    "policy.sequence_packing.enabled": True,                     # :332
    "policy.generation.backend": "vllm",
    NEMO_MEGATRON + "enabled": False,                            # :172
    NEMO_MEGATRON + "tensor_model_parallel_size": 1,             # :216
    NEMO_MEGATRON + "pipeline_model_parallel_size": 1,           # :219
    NEMO_MEGATRON + "context_parallel_size": 1,                  # :222
    NEMO_MEGATRON + "sequence_parallel": False,                  # :224
    NEMO_DDP + "overlap_grad_reduce": True,                      # :303
    NEMO_DDP + "overlap_param_gather": True,                     # :304
    NEMO_FP8 + "enabled": False,                                 # :309
    NEMO_FP8 + "fp8": "e4m3",
    NEMO_FP8 + "fp8_recipe": "blockwise",
    NEMO_FP8 + "fp8_param": False,
    NEMO_VLLM + "async_engine": False,                           # :412
    NEMO_VLLM + "precision": "${policy.precision}",              # :413
    NEMO_VLLM + "kv_cache_dtype": "auto",                        # :414
    NEMO_VLLM + "tensor_parallel_size": 1,                       # :416
    NEMO_VLLM + "expert_parallel_size": 1,                       # :418
    NEMO_VLLM + "use_deep_gemm": False,                          # :426
    NEMO_VLLM + "num_last_layers_in_bf16": 0,                    # :427
    NEMO_VLLM + "num_first_layers_in_bf16": 0,                   # :428
    "loss_fn.use_importance_sampling_correction": False,         # :93
}
NEMO_BASE = "NeMo RL default (examples/configs/grpo_math_1B.yaml @7ea279ab)"
STACK_DEFAULTS = {
    "skyrl": (SKYRL_DEFAULTS, "SkyRL default (SkyRL 0.4.0 skyrl/train/config/config.py)"),
    "verl": (VERL_DEFAULTS, "verl default (verl/trainer/config/rollout/rollout.yaml)"),
    "nemo-rl": (NEMO_DEFAULTS, NEMO_BASE),
}
