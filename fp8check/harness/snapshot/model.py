"""Snapshot: a read-only view of one engine's numeric state (name -> tensor, possibly lazy) plus its typed
record (harness.record: EngineRecord for the rollout, TrainerRecord for the trainer, PayloadMeta for the wire;
None for the masters)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch is imported where a tensor is made (pre-flight imports this without it)
    import torch


@dataclass
class Snapshot:
    role: str                                   # trainer | rollout | payload | master
    tensors: Mapping[str, torch.Tensor]
    meta: object = None
    # name -> (shape, dtype) of tensors held lazily (a digest-first capture's proven parameters): what `describe`
    # answers without making them
    specs: Mapping[str, tuple] | None = None
    # harness.record.DigestProof: the parameters a digest-first capture proved hold what a correct sync leaves
    # there (the checks compare those as the trainer's own tensors); this snapshot's alone, never written to disk
    proof: object = None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def get(self, name: str, default=None):
        return self.tensors[name] if name in self.tensors else default

    def names(self) -> list[str]:
        return list(self.tensors.keys())

    def describe(self, name: str) -> tuple[tuple, object]:
        """(shape, dtype) of one tensor, without making it where the snapshot knows them."""
        if self.specs is not None and name in self.specs:
            return self.specs[name]
        t = self.tensors[name]
        return tuple(t.shape), t.dtype
