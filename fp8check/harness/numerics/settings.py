"""Engine settings in one vocabulary: what a config implies (`config_settings`) and what a vLLM worker reports
(`read_settings`, from the worker extension's `fp8check_settings`). EngineRecord.settings carries it; C10 compares
the two, so the checks import no engine code."""
from __future__ import annotations

from ..kinds import Granularity, Quantization


def _kv_dtype(d):
    return "fp8_e4m3" if d == "fp8" else d          # vLLM: "fp8" is E4M3 on CUDA


def config_settings(config) -> dict:
    """The engine settings a config implies, in the vocabulary engines report them (EngineRecord.settings, C10):
    the quantization method its linears run, the weight block size, the KV-cache dtype, DeepGEMM / E8M0."""
    q = config.rollout.quantization
    block = config.engine_recipe.granularity is Granularity.BLOCK and q is not Quantization.NONE
    method = {Quantization.ONLINE_PER_BLOCK: "fp8-online-per-block",
              Quantization.ONLINE_PER_TENSOR: "fp8-online-per-tensor",
              Quantization.NONE: "bf16"}.get(q, "fp8-block" if block else str(config.recipe.granularity))
    return {"method": method,
            "weight_block_size": list(config.recipe.block_shape) if block else None,
            "kv_cache_dtype": _kv_dtype(config.rollout.kv_cache_dtype),
            "VLLM_USE_DEEP_GEMM": bool(config.rollout.use_deep_gemm),
            "VLLM_USE_DEEP_GEMM_E8M0": bool(config.deep_gemm_e8m0),
            "ue8m0_requant": bool(config.requant_ue8m0)}


def read_settings(raw: dict) -> dict:
    """What `fp8check_settings` read from a vLLM worker, in the same vocabulary as `config_settings`."""
    methods = set(raw.get("quant_methods") or ())
    if any("PerTensorOnline" in m for m in methods):
        method = "fp8-online-per-tensor"
    elif any("PerBlockOnline" in m for m in methods):
        method = "fp8-online-per-block"
    elif any(m.startswith("Fp8") for m in methods):
        method = "fp8-block" if raw.get("weight_block_size") else "fp8-per-tensor"
    elif methods and all(m.startswith("Unquantized") for m in methods):
        method = "bf16"
    else:
        method = ",".join(sorted(methods)) or None
    e8m0 = raw.get("ue8m0_in_use")
    if e8m0 is None:
        e8m0 = bool(raw.get("VLLM_USE_DEEP_GEMM")) and bool(raw.get("VLLM_USE_DEEP_GEMM_E8M0"))
    block = raw.get("weight_block_size") or ([128, 128] if method == "fp8-online-per-block" else None)
    return {"method": method, "weight_block_size": block,
            "kv_cache_dtype": _kv_dtype(raw.get("kv_cache_dtype")), "VLLM_USE_DEEP_GEMM": raw.get("VLLM_USE_DEEP_GEMM"),
            "VLLM_USE_DEEP_GEMM_E8M0": raw.get("VLLM_USE_DEEP_GEMM_E8M0"),
            "ue8m0_requant": bool(e8m0) and method in ("fp8-block", "fp8-online-per-block"), "read_from_engine": True}
