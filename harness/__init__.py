"""fp8check: the correctness harness for FP8 reinforcement learning of LLMs.

The public face (everything else is internal; docs/design.md has the layers). Names load lazily, so
`import harness` (and `fp8check --help`) does not import torch.

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
    run_catalog, CheckContext, Finding, CATALOG (the invariants), PASS / FAIL / UNKNOWN
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
    "SyncConfig": ("harness.config", "SyncConfig"),
    "recommended_config": ("harness.config", "recommended_config"),
    "config_from_job": ("harness.jobconfig", "config_from_job"),
    "get_recipe": ("harness.formats", "get_recipe"),
    "Recipe": ("harness.formats", "Recipe"),
    "get_model": ("harness.models", "get_model"),
    "with_layers": ("harness.models", "with_layers"),
    "register_model": ("harness.models", "register_model"),
    "spec_from_hf_config": ("harness.models", "spec_from_hf_config"),
    "run_sync": ("harness.sync.pipeline", "run_sync"),
    "reference_sync": ("harness.sync.pipeline", "reference_sync"),
    "DigestFirst": ("harness.sync.capture", "DigestFirst"),
    "FullRead": ("harness.sync.capture", "FullRead"),
    "check_sync": ("harness.integrations.check", "check_sync"),
    "watch": ("harness.integrations.check", "watch"),
    "run_catalog": ("invariants", "run_catalog"),
    "CheckContext": ("invariants", "CheckContext"),
    "Finding": ("invariants", "Finding"),
    "CATALOG": ("invariants", "REGISTRY"),
    "PASS": ("invariants", "PASS"),
    "FAIL": ("invariants", "FAIL"),
    "UNKNOWN": ("invariants", "UNKNOWN"),
    "register_engine": ("harness.engines.registry", "register_engine"),
    "make_engine": ("harness.engines.registry", "make_engine"),
    "ENGINES": ("harness.engines.registry", "ENGINES"),
    "Remote": ("harness.engines.remote", "Remote"),
    "WORKER_EXTENSION": ("harness.engines.vllm_extension", "WORKER_EXTENSION"),
    "FAULTS": ("faults", "FAULTS"),
    "Fault": ("faults", "Fault"),
    "Snapshot": ("harness.snapshot", "Snapshot"),
    "read_snapshot_dir": ("harness.snapshot", "read_snapshot_dir"),
    "write_snapshot_dir": ("harness.snapshot", "write_snapshot_dir"),
    "EngineRecord": ("harness.record", "EngineRecord"),
    "strategies": ("harness.strategies", None),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__
