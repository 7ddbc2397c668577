"""Fault (nemesis) core: a fault is a named, parameterised change at one stage of a sync, declaring the
invariants that must all fire on it (`trips`) and, apart, those that may also fire (`may`: consequences that
depend on the model or recipe). A fault is caught only when every invariant in `trips` fired (`Fault.verdict`);
some but not all is a partial catch, which fails the matrix like a miss. Faults never import checks' internals; checks never import faults. The pipeline
(harness.sync.pipeline) is the only code that interprets a stage:

  config   apply(config) -> config                         a misconfigured job: everything is built from it
  trainer  apply(config, trainer_hf, ctx) -> hf             the learner itself holds other bytes
  payload  apply(config, payload, ctx) -> payload           sender / wire bugs (pure function over the payload)
  buckets  apply(config, buckets) -> buckets                transport damage (pure function over bytes)
  engine   knobs={...}: injected into a running engine for one install (harness.engines.protocol.KNOBS), or
           apply(config) -> rollout engine built differently (another ignored_layers, a broken shard map)
  serving  knobs={...}: the serving cycle before the install (protocol.SERVING_KNOBS: sleep level, a
           generation served after the wake before the sync)

`ctx` is a harness.sync.pipeline.FaultContext (previous export, masters, the export under Megatron names).
Whether a fault can be injected into running engines is derived from its stage, knobs and setup
(`live_injectable`), never declared twice; `destructive` faults may leave a real engine needing repair and run
last in a live session.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from fp8check.harness.config import SyncConfig
from fp8check.harness.kinds import Stage, member, values
from fp8check.harness.layouts import scale_name
from fp8check.harness.sync.payload import Payload, record_for
from fp8check.harness.sync.pipeline import STAGES, NoTarget  # noqa: F401 - STAGES re-exported (the pipeline's list)


@dataclass(frozen=True)
class Fault:
    name: str
    family: str
    stage: Stage                        # a string is taken as its member
    trips: tuple[str, ...]              # invariant ids that must all fire
    description: str
    apply: Callable | None = None
    applies: Callable[[SyncConfig], bool] = lambda c: True
    configure: Callable[[SyncConfig], SyncConfig] | None = None   # environment the fault needs (e.g. TP=2)
    silent: bool = False                # keeps every shape and dtype
    knobs: dict | None = None           # engine stage: what a running engine is told to do wrong for one install
    destructive: bool = False           # may leave a real engine needing a repair (runs last live)
    params: dict = field(default_factory=dict)
    may: tuple[str, ...] = ()           # invariant ids that may also fire (never required, never a surprise)

    def __post_init__(self):
        stage = member(Stage, self.stage)
        if stage is None:
            raise ValueError(f"fault {self.name}: unknown stage {self.stage!r} (one of {', '.join(values(Stage))})")
        object.__setattr__(self, "stage", stage)        # frozen: the one coercion
        needs_apply = not (stage in (Stage.ENGINE, Stage.SERVING) and self.knobs)
        if (self.apply is not None) != needs_apply:
            raise ValueError(f"fault {self.name}: an engine fault has knobs or an engine factory; others an apply")

    @property
    def declared(self) -> tuple[str, ...]:
        """Every invariant this fault may make fire: the must-fire ones, then the may-fire ones."""
        return tuple(self.trips) + tuple(i for i in self.may if i not in self.trips)

    def verdict(self, fired) -> str:
        """caught: every must-fire invariant fired; partial: some did; missed: none did."""
        hit = set(fired) & set(self.trips)
        return "caught" if hit == set(self.trips) else ("partial" if hit else "missed")

    def undeclared(self, fired) -> list[str]:
        """Invariants that fired although the fault declares neither that they must nor that they may (the
        behavioural probe, which any fault that changes the served policy may trip, is never a surprise)."""
        return sorted(set(fired) - set(self.declared) - set(ANY_FAULT_MAY_TRIP))

    def with_params(self, **kw) -> "Fault":
        return replace(self, params={**self.params, **kw})

    def setup(self, config: SyncConfig) -> SyncConfig:
        return self.configure(config) if self.configure else config

    @property
    def needs_differential(self) -> bool:
        """Only a cold-vs-warm differential can see it (every declared invariant is of that scope)."""
        from fp8check.invariants import REGISTRY
        return all(REGISTRY[i].scope == "differential" for i in self.trips)

    def live_injectable(self, config: SyncConfig, engine_knobs=frozenset()) -> bool:
        """Can this fault be injected into engines already running `config`? Not a config change, not an engine
        that must be built differently, not an environment that changes the engines (transport settings may
        change), knobs the running engine supports, and a target in this model."""
        if self.stage is Stage.CONFIG or (self.stage is Stage.ENGINE and not self.knobs):
            return False
        if self.stage is Stage.ENGINE and not set(self.knobs) <= set(engine_knobs):
            return False
        if not self.applies(config):
            return False
        return _engine_side(self.setup(config)) == _engine_side(config)


def _engine_side(c: SyncConfig):
    """What the engines are built from (a fault whose setup changes any of it needs new engines)."""
    return (c.model, c.recipe, c.sync_mode, c.exclude_patterns, c.trainer, c.rollout, c.seed, c.arch, c.lora_rank,
            c.lora_merge)


FAULTS: dict[str, Fault] = {}
# P1 judges the policy the engine serves: whether a fault that damages weights moves the log-probs past its bound
# depends on how much it damages, so any fault may trip it (the matrix runs it only where a fault declares it)
ANY_FAULT_MAY_TRIP = ("P1",)


def register(fault: Fault) -> Fault:
    if fault.name in FAULTS:
        raise ValueError(f"fault {fault.name} registered twice")
    FAULTS[fault.name] = fault
    return fault


def live_faults(config: SyncConfig, engine_knobs=frozenset(), differential: bool = False) -> list[str]:
    """Every fault injectable into engines running `config`, in the order a live session injects them: the
    registry's order, destructive ones last. `differential`: the session also runs the cold-vs-warm
    differential (faults only it can see are included)."""
    names = [n for n, f in FAULTS.items() if f.live_injectable(config, engine_knobs)
             and (differential or not f.needs_differential)]
    return [n for n in names if not FAULTS[n].destructive] + [n for n in names if FAULTS[n].destructive]


# The faults a live session injects at a real model's shapes (`fp8check live --faults real-shape`, the GPU suite):
# scales, layouts at real head counts and expert counts, coverage, post-load, and the gated delta-net's own (in_proj
# member order, A_log / dt_bias). Keyed by shipped config; each must apply at the depths the GPU plans cut to (a
# Qwen3.5 model's first full-attention layer is layer 3).
REAL_SHAPE_FAULTS = {
    "qwen3-8b": ("scale_x2_block", "fp32_scales_rounded_pow2", "megatron_qkv_not_deinterleaved",
                 "rows_shifted_one_block", "scale_dropped", "postprocess_twice", "stale_layer_unstamped"),
    "qwen3-30b-a3b": ("experts_permuted", "scale_bit_flip", "scale_dropped", "postprocess_skipped"),
    "qwen3.5-9b": ("scale_x2_block", "fp32_scales_rounded_pow2", "megatron_qkv_not_deinterleaved",
                   "rows_shifted_one_block", "scale_dropped", "postprocess_twice", "gdn_in_proj_misordered",
                   "gdn_a_log_dt_bias_swapped"),
    "qwen3.5-35b-a3b": ("experts_permuted", "scale_bit_flip", "scale_dropped", "postprocess_skipped",
                        "gdn_a_log_dt_bias_swapped"),
}


def real_shape_faults(model: str) -> tuple[str, ...]:
    """The real-shape fault set of a shipped model (`name` or `name@<N>L`); LookupError for another model."""
    base = model.split("@", 1)[0]
    if base not in REAL_SHAPE_FAULTS:
        raise LookupError(f"no real-shape fault set for {model!r}; sets: {', '.join(REAL_SHAPE_FAULTS)}")
    return REAL_SHAPE_FAULTS[base]


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
        raise NoTarget("no target tensor for this fault in this model")
    return names[index % len(names)]


def layer_of(name: str) -> str | None:
    """The `...layers.N.` prefix of a checkpoint name, None outside the layers."""
    from fp8check.harness.layouts import split_layer
    return split_layer(name)[0] or None


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


__all__ = ["FAULTS", "Fault", "NoTarget", "REAL_SHAPE_FAULTS", "STAGES", "add", "drop", "fp8_targets", "layer_of", "live_faults",
           "pick", "real_shape_faults", "register", "replace_tensor", "scale_name", "swap", "with_config",
           "with_rollout", "with_trainer"]
