"""The engine configurations the CPU reference rollout is proven against on the GPU machine
(tests/gpu/test_vllm_conformance.py), shared with the CPU test that they are distinguishable."""
from fp8check.faults.base import with_rollout
from fp8check.harness.config import recommended_config


def _rollout(cfg, **kw):
    return with_rollout(**kw)(cfg)


def configs():
    """Each model x scale format x DeepGEMM E8M0 setting (clean configs resolve FP32 -> E8M0 off, power-of-two ->
    on); the last one also routes the MoE experts through DeepGEMM, which requantizes them too."""
    d32, p32 = recommended_config("tiny-dense", "blockwise-fp32"), recommended_config("tiny-dense", "blockwise-pow2")
    m32, mp2 = recommended_config("tiny-moe", "blockwise-fp32"), recommended_config("tiny-moe", "blockwise-pow2")
    return {
        "dense-fp32": d32,
        "dense-fp32-e8m0": _rollout(d32, deep_gemm_e8m0=True),      # vLLM's own default on Hopper
        "dense-pow2-e8m0": p32,
        "moe-fp32": m32,
        "dense-pow2": _rollout(p32, deep_gemm_e8m0=False),
        "moe-fp32-e8m0": _rollout(m32, deep_gemm_e8m0=True),
        "moe-pow2-e8m0": mp2,
        "moe-pow2": _rollout(mp2, deep_gemm_e8m0=False),
        "moe-fp32-e8m0-deepgemm-experts": _rollout(m32, deep_gemm_e8m0=True, moe_backend="deep_gemm"),
    }
