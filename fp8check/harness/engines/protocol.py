"""The engine protocol: what the pipeline asks of a trainer and of a rollout engine (docs/design.md, "Engines").

An engine is any object with these methods; the registry (harness.engines.registry) checks the surface when an
engine registers. The pipeline talks to engines only through it, in process or through the remote wrapper
(harness.engines.remote), so the CPU reference, vLLM, Megatron/TE and a user's own engine are interchangeable.

Reads never change engine state; only `optimizer_step`, `poison` and `install` do.
"""
from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import torch

from ..record import EngineRecord, TrainerRecord, UpdateRecord

# (name, tensor, version) as the pipeline hands them to `install`
Item = tuple[str, torch.Tensor, int]

# Engine-stage fault knobs an engine may support while running (Fault.knobs uses these names; the pure mirrors
# declare none, fp8check's own engines -- cpu/perturbed.py, the vLLM test extension -- all):
#   post_process_repeats  int   how many times post-load processing runs per completed module (1 = correct)
#   detach_on_install     bool  write loaded weights into new tensors instead of the captured storage
#   generate_during_update int  serve one generation request after this many loads of an update
#   kv_scale_placeholder  float a reload leaves one layer's KV-cache k scale at this placeholder value
#   realloc_buffer        bool  a reload rebinds a graph-visible buffer to new storage
#   keep_prefix_cache     bool  the prefix cache is not reset after the weight sync
#   logit_scale           float the engine serves with its logits multiplied by this (until the next install)
#   shard_offsets_lost    bool  every shard of a fused parameter is written at offset 0 of its (uninitialised)
#                               staging buffer: shards clobber each other, the rest stays uninitialised
#   packed_scales_copied  bool  post-load copies the checkpoint-layout scale grid's bytes into a scale tensor the
#                               kernel reads MN-major (a patched post-process into DeepGEMM's packed layout)
KNOBS = ("post_process_repeats", "detach_on_install", "generate_during_update", "kv_scale_placeholder",
         "realloc_buffer", "keep_prefix_cache", "logit_scale", "shard_offsets_lost", "packed_scales_copied")
# Serving-cycle knobs the pipeline turns itself (faults of stage "serving", harness.sync.pipeline.serving_cycle):
#   sleep_level           int   sleep at this level and wake before the sync
#   generate_before_sync  bool  serve a generation after the wake, before the weights are synced again
#   wake_kv_scales        dict  the wake leaves these KV-cache scales ({"k": 0.0} or {"k": 1.0, "v": 1.0}) in
#                               every attention layer (an engine's wake fault, turned by fp8check's own engines)
SERVING_KNOBS = ("sleep_level", "generate_before_sync", "wake_kv_scales")


class EngineError(RuntimeError):
    """The engine refused an operation (a real engine raises here too); the checks judge the state it left."""


@runtime_checkable
class TrainerEngine(Protocol):
    engine: str          # what it is, e.g. "megatron-core+transformer-engine"
    step: int            # optimizer steps taken (the version a sync of its weights carries)

    def optimizer_step(self) -> int: ...

    def export_hf(self) -> dict[str, torch.Tensor]:
        """The learner's FP8 forward weights in checkpoint (HF) names: codes + `weight_scale_inv` for FP8 GEMMs,
        BF16 elsewhere. Exactly the bytes the learner's forward uses; a fresh dict."""

    def master_hf(self) -> dict[str, torch.Tensor]:
        """The high-precision masters in HF names (C1 re-derives the FP8 weights from them)."""

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]: ...

    def record(self) -> TrainerRecord: ...


@runtime_checkable
class RolloutEngine(Protocol):
    engine: str
    knobs: frozenset     # the KNOBS this engine can inject while running

    def poison(self) -> None:
        """Test mode before a sync: every destination byte set to the sentinel (S1 proves none survives)."""

    def install(self, items: Iterable[Item], version: int | None, *, direct: bool = False,
                knobs: dict | None = None) -> UpdateRecord:
        """One weight update (checkpoint-format tensors); `direct`: the model's own load_weights instead of the
        engine's reload path. Raises EngineError when the engine refuses (its state is then checked as left)."""

    def quantize_online(self, items: list[Item]) -> list[Item]:
        """The naive sync: BF16 weights quantized by the engine's own quantizer (FP8 weights gain a scale)."""

    def state_digests(self) -> dict[str, str]:
        """Rank-named parameter -> streaming state digest (harness.digest), computed where the tensors live."""

    def kernel_tensors(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """What the kernels read, rank-named, as host tensors (a parameter without bytes is left out). An engine
        living in the pipeline's process may also offer `kernel_views(names)`: the same tensors without a copy,
        which the full-read capture uses to compare the state after a re-sync (optional)."""

    def record(self) -> EngineRecord: ...

    def generate_logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]: ...

    # optional: a bucketed update as vLLM 0.26's weight transfer receives one -- `start_update(version)`, then
    # `load_bucket(items)` once per bucket, then `finish_update()` (one layerwise reload across every bucket:
    # a layer is processed when its last element arrives, what never completed at finish); the pytest plugin
    # feeds a user's buckets through it, and falls back to one `install` where an engine lacks it


REQUIRED = {
    "trainer": ("optimizer_step", "export_hf", "master_hf", "logprobs", "record"),
    "rollout": ("poison", "install", "quantize_online", "state_digests", "kernel_tensors", "record",
                "generate_logprobs"),
}
ATTRIBUTES = {"trainer": ("engine",), "rollout": ("engine", "knobs")}
# optional: `record_and_digests()` -> (record(), state_digests()) in one call (an engine in another process: one
# round trip, and its digests computed while the record's host reads run); `weight_checksums()` / `reset_weights()`:
# vLLM's own weight checker (0.32+, or the CPU mirror's), the second oracle of e2e.oracles;
# `harness.engines.remote.offers` asks
OPTIONAL = {"trainer": (), "rollout": ("record_and_digests", "weight_checksums", "reset_weights")}


def missing_surface(kind: str, cls) -> list[str]:
    """Protocol members a class lacks (methods must be callable; attributes may be set in __init__ and are
    checked on instances only)."""
    out = [m for m in REQUIRED[kind] if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type):
        out += [a for a in ATTRIBUTES[kind] if not hasattr(cls, a)]
    return out


__all__ = ["ATTRIBUTES", "EngineError", "Item", "KNOBS", "OPTIONAL", "REQUIRED", "SERVING_KNOBS", "RolloutEngine", "TrainerEngine", "missing_surface"]
