"""fp8check: the correctness harness for FP8 reinforcement learning of LLMs.

The public face (everything else is internal; docs/design.md has the layers). Names load lazily, so
`import fp8check` (and `fp8check --help`) does not import torch.

Configuration
    SyncConfig            the one object trainer, rollout and checks read (recipe, exclusion set, layout, engines)
    recommended_config    a SyncConfig with the recommended engine settings for a model and recipe
    config_from_job       the SyncConfig of your RL job file (SkyRL, verl, NeMo RL keys), as pre-flight reads it
    get_recipe, Recipe    named FP8 recipes (blockwise-fp32, blockwise-pow2, mxfp8)
    get_model             a model: built-in, shipped real shape (qwen3-8b, qwen3-30b-a3b), NAME@<N>L, or a
                          config.json / checkpoint path; with_layers(name, N) cuts one to its first N layers
    register_model        make a ModelSpec (e.g. from a config.json) available by name
    spec_from_hf_config   a ModelSpec with the dims of a Hugging Face config.json
The one road
    run_sync              one weight sync through the pipeline (export -> payload -> buckets -> install ->
                          capture -> checks) between any trainer and rollout engine
    reference_sync        the same with the CPU reference engines
    DigestFirst, FullRead how the engine state is captured
    check_sync            check a sync your own RL job performed, against a vLLM engine carrying
                          WORKER_EXTENSION (harness.integrations)
    watch                 instrument such an engine once after start-up (post-load counts, storage moves)
The catalog
    run_catalog, CheckContext, Finding, CATALOG (the invariants), Verdict (PASS / FAIL / UNKNOWN)
Engines
    register_engine, make_engine, ENGINES, Remote (any engine as a Ray actor or in process), WORKER_EXTENSION
Faults
    FAULTS, Fault         the fault injectors (each declares the invariants it must trip)
Snapshots
    Snapshot, read_snapshot_dir, write_snapshot_dir, EngineRecord
Fuzzing
    strategies            Hypothesis strategies for your own sync code
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "SyncConfig": ("fp8check.harness.config", "SyncConfig"),
    "recommended_config": ("fp8check.harness.config", "recommended_config"),
    "config_from_job": ("fp8check.harness.jobconfig", "config_from_job"),
    "get_recipe": ("fp8check.harness.formats", "get_recipe"),
    "Recipe": ("fp8check.harness.formats", "Recipe"),
    "get_model": ("fp8check.harness.models", "get_model"),
    "with_layers": ("fp8check.harness.models", "with_layers"),
    "register_model": ("fp8check.harness.models", "register_model"),
    "spec_from_hf_config": ("fp8check.harness.models", "spec_from_hf_config"),
    "run_sync": ("fp8check.harness.sync.pipeline", "run_sync"),
    "reference_sync": ("fp8check.harness.sync.pipeline", "reference_sync"),
    "DigestFirst": ("fp8check.harness.sync.capture", "DigestFirst"),
    "FullRead": ("fp8check.harness.sync.capture", "FullRead"),
    "check_sync": ("fp8check.harness.integrations.check", "check_sync"),
    "watch": ("fp8check.harness.integrations.check", "watch"),
    "run_catalog": ("fp8check.invariants", "run_catalog"),
    "CheckContext": ("fp8check.invariants", "CheckContext"),
    "Finding": ("fp8check.invariants", "Finding"),
    "CATALOG": ("fp8check.invariants", "REGISTRY"),
    "PASS": ("fp8check.invariants", "PASS"),
    "FAIL": ("fp8check.invariants", "FAIL"),
    "UNKNOWN": ("fp8check.invariants", "UNKNOWN"),
    "Verdict": ("fp8check.invariants", "Verdict"),
    "register_engine": ("fp8check.harness.engines.registry", "register_engine"),
    "make_engine": ("fp8check.harness.engines.registry", "make_engine"),
    "ENGINES": ("fp8check.harness.engines.registry", "ENGINES"),
    "Remote": ("fp8check.harness.engines.remote", "Remote"),
    "WORKER_EXTENSION": ("fp8check.harness.engines.vllm_extension", "WORKER_EXTENSION"),
    "FAULTS": ("fp8check.faults", "FAULTS"),
    "Fault": ("fp8check.faults", "Fault"),
    "Snapshot": ("fp8check.harness.snapshot", "Snapshot"),
    "read_snapshot_dir": ("fp8check.harness.snapshot", "read_snapshot_dir"),
    "write_snapshot_dir": ("fp8check.harness.snapshot", "write_snapshot_dir"),
    "EngineRecord": ("fp8check.harness.record", "EngineRecord"),
    "strategies": ("fp8check.harness.strategies", None),
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
