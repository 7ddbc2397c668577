"""fp8check: the correctness harness for FP8 reinforcement learning of LLMs.

The public API. Everything else is internal and imported from its own module (docs/design.md has the layers).
Names load lazily, so `import fp8check` (and `fp8check --help`) does not import torch.

Check a sync your RL job performed
    check_sync            run the catalog on a vLLM engine (started with WORKER_EXTENSION) after your own sync;
                          raises SyncCheckFailed naming every violated invariant, root first
    watch                 instrument such an engine once after start-up (post-load counts, storage moves)
    WORKER_EXTENSION      the read-only vLLM worker extension: `vllm.LLM(..., worker_extension_cls=WORKER_EXTENSION)`
    engine_env            the environment a vLLM engine needs for a config (e.g. VLLM_USE_DEEP_GEMM_E8M0=0)
Configuration
    SyncConfig            the one object the trainer, the rollout engine and the checks read
    recommended_config    a SyncConfig with the recommended engine settings for a model and recipe
    config_from_job       the SyncConfig of an RL job file (SkyRL, verl, NeMo RL keys), as `fp8check preflight`
                          reads it
    get_recipe            a named FP8 recipe (blockwise-fp32, blockwise-pow2, mxfp8); its `quantize_weight(w)`
                          is Transformer Engine's rule, the helper a hand-written sync may call
Results
    Finding               one check's result: invariant_id, verdict, tensor, message, evidence
    Verdict               PASS / FAIL / UNKNOWN (a StrEnum: they compare equal to "pass" / "fail" / "unknown")
    SyncCheckFailed       raised by check_sync and the pytest plugin's fp8check_sync; `.findings`, root first
Fuzzing
    strategies            Hypothesis strategies for your own sync code (`pip install 'fp8check[strategies]'`)

The pytest plugin (fixtures `fp8check_sync`, `fp8check_config`, ...) loads from its entry point: nothing to import.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "check_sync": ("fp8check.harness.integrations.check", "check_sync"),
    "watch": ("fp8check.harness.integrations.check", "watch"),
    "SyncCheckFailed": ("fp8check.harness.integrations.check", "SyncCheckFailed"),
    "WORKER_EXTENSION": ("fp8check.harness.engines.vllm_extension", "WORKER_EXTENSION"),
    "engine_env": ("fp8check.harness.engines.vllm", "engine_env"),
    "SyncConfig": ("fp8check.harness.config", "SyncConfig"),
    "recommended_config": ("fp8check.harness.config", "recommended_config"),
    "config_from_job": ("fp8check.harness.jobconfig", "config_from_job"),
    "get_recipe": ("fp8check.harness.formats", "get_recipe"),
    "Finding": ("fp8check.invariants", "Finding"),
    "Verdict": ("fp8check.invariants", "Verdict"),
    "strategies": ("fp8check.strategies", None),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fp8check' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__
