"""Fault (nemesis) core: a fault is a named, parameterised change at one stage of a sync, declaring the
invariants it must trip. Faults never import checks' internals; checks never import faults.

Stages (where `apply` acts):
  config   (config) -> config                       a misconfigured job: everything is built from it
  trainer  (config, trainer_hf, trainer) -> hf      the learner itself holds other bytes
  payload  (config, payload, ctx) -> payload        sender / wire bugs (pure function over the payload)
  buckets  (config, buckets) -> buckets             transport damage (pure function over bytes)
  engine   (config) -> rollout engine               a misbehaving or misconfigured engine
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from harness.config import SyncConfig
from harness.layouts import scale_name
from harness.sync.payload import Payload, record_for

STAGES = ("config", "trainer", "payload", "buckets", "engine")


@dataclass(frozen=True)
class Fault:
    name: str
    family: str
    stage: str
    trips: tuple[str, ...]              # invariant ids; at least one must fire
    description: str
    apply: Callable
    applies: Callable[[SyncConfig], bool] = lambda c: True
    configure: Callable[[SyncConfig], SyncConfig] | None = None   # environment the fault needs (e.g. TP=2)
    silent: bool = False                # keeps every shape and dtype
    live: bool = False                  # also injectable into the real engines (payload / engine settings)
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"fault {self.name}: unknown stage {self.stage!r}")

    def with_params(self, **kw) -> "Fault":
        return replace(self, params={**self.params, **kw})

    def setup(self, config: SyncConfig) -> SyncConfig:
        return self.configure(config) if self.configure else config

    def hooks(self):
        """SyncHooks for the CPU reference sync."""
        from harness.sync.session import SyncHooks
        p = self.params
        if self.stage == "trainer":
            return SyncHooks(trainer=lambda c, hf, t: self.apply(c, hf, t, **p))
        if self.stage == "payload":
            return SyncHooks(payload=lambda c, pl, ctx: self.apply(c, pl, ctx, **p))
        if self.stage == "buckets":
            return SyncHooks(buckets=lambda c, b: self.apply(c, b, **p))
        if self.stage == "engine":
            return SyncHooks(make_rollout=lambda c: self.apply(c, **p))
        return SyncHooks()


FAULTS: dict[str, Fault] = {}


def register(fault: Fault) -> Fault:
    if fault.name in FAULTS:
        raise ValueError(f"fault {fault.name} registered twice")
    FAULTS[fault.name] = fault
    return fault


# -- configuration changes (config-stage faults and `configure`) ----------------------------------------------------
def with_config(**kw):
    return lambda c: replace(c, **kw)


def with_rollout(**kw):
    return lambda c: replace(c, rollout=replace(c.rollout, **kw))


def with_trainer(**kw):
    return lambda c: replace(c, trainer=replace(c.trainer, **kw))


# -- target selection: deterministic, overridable through params ---------------------------------------------------
def fp8_targets(config: SyncConfig, *, square: bool | None = None, suffix: tuple[str, ...] = ()) -> list[str]:
    out = []
    for t in config.spec.tensors():
        if t.name not in config.fp8_tensors:
            continue
        if square is not None and (t.shape[0] == t.shape[1]) != square:
            continue
        if suffix and not t.module.endswith(suffix):
            continue
        out.append(t.name)
    return out


def pick(names: list[str], index: int = 0) -> str:
    if not names:
        raise LookupError("no target tensor for this fault in this model")
    return names[index % len(names)]


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return ".".join(parts[:3]) + "." if len(parts) > 3 and parts[1] == "layers" else None


# -- payload edits (pure) ----------------------------------------------------------------------------------------
def replace_tensor(p: Payload, name: str, t: torch.Tensor) -> Payload:
    """Sender-side change: the manifest faithfully describes the wrong bytes."""
    return p.with_tensor(name, t, restamp=True)


def drop(p: Payload, name: str) -> Payload:
    return Payload([r for r in p.records if r.name != name], {k: v for k, v in p.tensors.items() if k != name},
                   p.version)


def add(p: Payload, name: str, t: torch.Tensor, role: str, after: str | None = None, version: int | None = None) -> Payload:
    rec = record_for(name, role, t, p.version if version is None else version)
    recs = list(p.records)
    idx = next((i + 1 for i, r in enumerate(recs) if r.name == after), len(recs)) if after else len(recs)
    recs.insert(idx, rec)
    tensors = dict(p.tensors)
    tensors.setdefault(name, t)
    return Payload(recs, tensors, p.version)


def swap(p: Payload, a: str, b: str) -> Payload:
    """Exchange the contents of two tensors (names and records stay, bytes move)."""
    ta, tb = p.tensors[a], p.tensors[b]
    return replace_tensor(replace_tensor(p, a, tb), b, ta)


__all__ = ["FAULTS", "Fault", "STAGES", "add", "drop", "fp8_targets", "layer_of", "pick", "register",
           "replace_tensor", "scale_name", "swap", "with_config", "with_rollout", "with_trainer"]
