"""The one road every sync takes (docs/design.md, "The one road"): `run_sync`, the driver of fp8check's own sync,
composing the stages of `harness.sync.stages`:

    export -> (serving cycle) -> poison -> send (payload -> buckets -> receive) -> install -> capture -> re-sync
    -> checks

(S1's poison is started right after the export and waited for before the install: an engine in its own process
fills its parameters while the payload is built. The capture's expected side begins while the install runs.)

`run_sync` drives one weight sync from any trainer into any rollout engine (the engine protocol: in process or
behind the remote wrapper), and is the only code that interprets a fault's stage (`interceptors`, `fault_config`,
`builds_engine`): the stages take what a fault does as `stages.Interceptors`. `fp8check faults`, `snapshot`,
`bench`, `live`, `preflight --probe` and the end-to-end RL loop run through it; `check_sync` and the pytest
plugin are drivers over the same stages. How the engine state is captured (full read vs digest-first) is a
strategy (harness.sync.capture), and how the wire is packed and received another (`pack`, `receive`:
harness.sync.transport's `pack` and `hashing` by default; the fault matrix passes its own).

Fault stages (a fault is any object with `stage`, `apply`, `params`, `setup`, and for the engine stage `knobs`):
  config   (config) -> config                       a misconfigured job: engines are built from it (`fault_config`)
  trainer  (config, trainer_hf, ctx) -> hf          the learner itself holds other bytes
  payload  (config, payload, ctx) -> payload        sender / wire bugs (pure function over the payload)
  buckets  (config, buckets) -> buckets             transport damage (pure function over bytes)
  engine   knobs injected into a running engine for one install, or (config) -> engine built differently
  serving  knobs of the serving cycle before the install (`serving_cycle`: sleep at a level, wake, perhaps serve
           before the sync), for engines in sleep mode
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from ..config import SyncConfig
from ..kinds import Stage
from ..layouts import LayoutError
from ..record import PayloadMeta, Resync
from ..snapshot.model import Snapshot
from . import stages
from .capture import DigestFirst, FullRead
from .payload import Payload
from .stages import Interceptors, install_items
from .timing import Clock
from .transport import ReceiveReport, hashing, pack

STAGES = tuple(Stage)


class NoTarget(Exception):
    """A fault injector found nothing to corrupt in this model or configuration (no tensor of the kind it damages,
    one bucket only, no previous step): the one way an injector says it does not apply. Any other exception an
    injector raises is an error, never a skipped cell (a KeyError is a bug in the injector, not a missing target)."""


@dataclass
class FaultContext:
    """What a trainer or payload fault may read: the previous step's export, the masters, the learner's export,
    and the learner's FP8 weights under Megatron names (all derived from data, never from an engine object)."""
    config: SyncConfig
    trainer_hf: dict
    _previous: object = None            # the previous export, or a callable that makes it (read once)
    _master: object = None

    @property
    def previous(self) -> dict | None:
        if callable(self._previous):
            self._previous = self._previous()
        return self._previous

    def master_hf(self) -> dict:
        if self._master is None:
            raise NoTarget("the trainer's masters are not available to this fault")
        return self._master() if callable(self._master) else self._master

    def megatron(self) -> dict:
        """The learner's FP8 codes and scales (and high-precision tensors) under Megatron names."""
        try:
            return self.config.layout.hf_to_megatron(self.trainer_hf, with_scales=True)
        except LayoutError as e:        # the learner's own export: a map that fails here is a bug, not a target
            raise RuntimeError(f"the export does not map back to Megatron names: {e}") from None


@dataclass
class SyncResult:
    config: SyncConfig
    version: int
    sent: Payload
    received: Payload
    report: ReceiveReport
    trainer: Snapshot
    rollout: Snapshot
    payload: Snapshot
    master: Snapshot | None
    errors: list = field(default_factory=list)
    fetched: int = 0
    params: int = 0
    mismatching: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)
    findings: list | None = None
    probes: dict | None = None           # the probe's metrics (learner vs sampler on the probe prompts)
    probe_run: object = None             # invariants.probes.ProbeRun: the log-probs P1 judges
    deferred: list = field(default_factory=list)    # left to a schedule's periodic syncs (`periodic=False`)
    screens: object = None               # the checks' screens of the trainer's tensors, begun beside the install

    def context(self, probe_bounds=None):
        from fp8check.invariants import CheckContext
        return CheckContext(self.config, self.payload, self.trainer, self.rollout, self.master, self.probe_run,
                            probe_bounds, screens=self.screens)

    @property
    def fired(self) -> list[str]:
        return sorted({f.invariant_id for f in self.findings or [] if f.verdict == "fail"})

    @property
    def unknown(self) -> list[str]:
        return sorted({f.invariant_id for f in self.findings or [] if f.verdict == "unknown"})


def fault_config(config: SyncConfig, fault) -> SyncConfig:
    """The configuration a sync under `fault` runs with: the environment the fault needs (`setup`), then a
    config-stage fault's misconfiguration. Trainer, engines, payload and checks are all built from it."""
    if fault is None:
        return config
    config = fault.setup(config)
    if fault.stage == Stage.CONFIG:
        config = fault.apply(config, **fault.params)
    return config


def serving_cycle(rollout, knobs: dict, prompts):
    """Sleep at `sleep_level` and wake (what a colocated RL loop does around every train step); with
    `generate_before_sync`, serve a generation after the wake before the next weight sync (the fault)."""
    rollout.sleep(int(knobs.get("sleep_level", 1)))
    if knobs.get("wake_kv_scales") is not None:        # what a broken wake does to the KV-cache scales
        rollout.wake(kv_scales=dict(knobs["wake_kv_scales"]))
    else:
        rollout.wake()
    if knobs.get("generate_before_sync"):
        rollout.generate_logprobs(prompts[:1])


def builds_engine(fault) -> bool:
    """An engine-stage fault that needs an engine built differently (not knobs on a running one)."""
    return fault is not None and fault.stage == Stage.ENGINE and not fault.knobs


def payload_snapshot(payload: Payload, report: ReceiveReport | None = None) -> Snapshot:
    return Snapshot("payload", dict(payload.tensors), PayloadMeta(payload.version, list(payload.records), report))


def interceptors(fault) -> Interceptors:
    """What `fault` does to one sync, each at the stage it corrupts (the config stage is `fault_config`'s, an
    engine built differently `reference_engines`'): the one place a fault's stage is read."""
    if fault is None:
        return Interceptors()
    if fault.stage not in STAGES:
        raise ValueError(f"fault {fault.name}: unknown stage {fault.stage!r}")
    stage, apply, params = fault.stage, fault.apply, fault.params
    return Interceptors(
        on_trainer=(lambda config, hf, ctx: apply(config, hf, ctx, **params)) if stage == Stage.TRAINER else None,
        on_payload=((lambda config, payload, ctx: apply(config, payload, ctx, **params))
                    if stage == Stage.PAYLOAD else None),
        on_buckets=(lambda config, buckets: apply(config, buckets, **params)) if stage == Stage.BUCKETS else None,
        engine_knobs=dict(fault.knobs) if stage == Stage.ENGINE and fault.knobs else None,
        serving=dict(fault.knobs or {}) if stage == Stage.SERVING else None)


def run_sync(config: SyncConfig, trainer, rollout, *, fault=None, capture=None, previous: dict | None = None,
             poison: bool = True, resync: bool = True, naive: bool = False, direct: bool = False,
             master: bool = True, checks: bool = True, check_ids=None, probes: bool = False, probe_bounds=None,
             prompts=None, periodic: bool = True, catalog: bool = True, receive=hashing, pack=pack,
             ahead_on_cpu: bool = False) -> SyncResult:
    """One sync of the trainer's current weights into `rollout`, then the catalog: the stages
    (`harness.sync.stages`) in order, with `fault` applied at the stage it corrupts (`interceptors`).

    `config`: as `fault_config` returned it (the engines were built from it). `previous`: the trainer's export
    before its last step, or a callable that makes it (faults that mix versions draw from it). `naive`: the
    failure mode the tool exists for (the FP8 forward weight dequantized to BF16 and quantized again by the
    engine). `direct`: install through the model's own load_weights. `capture`: FullRead (default) or
    DigestFirst. `receive(buckets, verify_digests, sent)`: how the wire is received (`transport.hashing`, default),
    and `pack(payload, bucket_bytes)` how it is packed (`transport.pack`); the fault matrix passes its own pair,
    for a receiver that may read the sender's tensors. `ahead_on_cpu`: what is begun beside the install runs in
    the background thread on CPU tensors too (as on the GPU path). `periodic=False`: a schedule's cheap sync
    (checks left on for every sync of a run): what costs as much as the sync itself -- S7's re-sync, the periodic
    invariants (P1's forwards, C1's requantization) -- is left to the periodic syncs and named in
    `SyncResult.deferred`. `catalog=False`: the sync alone -- no poison, no record, no capture, no checks -- the
    baseline a bench measures what the catalog adds against (the catalog overlaps the wire and the install).
    `SyncResult.seconds`: where the time went (`timing.Clock`)."""
    hooks, capture, clock, poison = interceptors(fault), capture or FullRead(), Clock(), poison and catalog
    with clock("export"):
        ex = stages.export(trainer, master)
    version, masters = ex.record.version, ex.master_hf if master else trainer.master_hf
    if prompts is None:
        from fp8check.invariants.probes import prompts_for
        prompts = prompts_for(config.spec.vocab_size)
    if hooks.serving is not None:
        serving_cycle(rollout, hooks.serving, prompts)
    poisoning = None
    if poison:                    # S1's sentinel, a check's cost: the engine fills its parameters during the wire
        with clock("poison"):
            poisoning = stages.start_poison(rollout)
    with clock("wire"):
        fctx = FaultContext(config, ex.hf, previous, masters)
        wire = stages.send(config, ex.hf, version, masters, fctx, hooks, naive=naive, receive=receive, pack=pack)
    trainer_hf, items = wire.trainer_hf, install_items(wire.received)
    if naive:
        items = rollout.quantize_online(items)
    screens = checks and (check_ids is None or "S3" in check_ids)      # S3 is the screens' one reader
    beside = (lambda apart: stages.begin_capture(capture, config, rollout, trainer_hf, poison, apart=apart,
                                                 screens=screens, on_cpu=ahead_on_cpu)) if catalog else None
    errors, begun = stages.install(rollout, items, version, clock=clock, direct=direct, knobs=hooks.engine_knobs,
                                   poisoning=poisoning, beside=beside)
    payload = payload_snapshot(wire.received, wire.report)
    if not catalog:
        res = SyncResult(config, version, wire.sent, wire.received, wire.report,
                         Snapshot("trainer", dict(trainer_hf), ex.record), Snapshot("rollout", {}, None), payload,
                         None, errors)
        res.seconds = clock.seconds()
        return res
    clock.memory_from_here()
    record, got = stages.capture_state(capture, config, rollout, trainer_hf, clock=clock, begun=begun,
                                       poisoned=poison)
    if not periodic:
        record.resync = Resync(deferred=True)
    elif resync and not errors:   # one more install, by definition as dear as one (timed apart)
        with clock("resync"):
            again = partial(rollout.install, items, version, direct=direct, knobs=hooks.engine_knobs)
            record.resync = stages.resync(config, capture, rollout, got, (n for n, *_ in items), again)
    record.version, record.errors = version, errors
    clock.capture_memory()
    res = SyncResult(config, version, wire.sent, wire.received, wire.report,
                     Snapshot("trainer", dict(trainer_hf), replace(ex.record, fp8_param=config.trainer.fp8_param)),
                     stages.rollout_snapshot(got, record), payload,
                     Snapshot("master", ex.master_hf) if ex.master_hf is not None else None, errors,
                     got.fetched, got.params, got.mismatching)
    if probes and periodic:       # the engines' probe feeds P1 alone, a periodic invariant
        with clock("probes"):
            res.probe_run = stages.probe(trainer, rollout, prompts)
        res.probes = res.probe_run.metrics
    if checks:
        ctx = res.context(probe_bounds)
        done = stages.check(ctx, ids=check_ids, periodic=periodic, screening=begun.screening, clock=clock)
        res.findings, res.screens = done.findings, ctx.screens
        if not periodic:
            from fp8check.invariants import REGISTRY
            res.deferred = ["S7:idempotence"] + [i for i, v in REGISTRY.items() if v.periodic and i not in done.ran]
    clock.checks_memory(checks)
    res.seconds = clock.seconds()
    return res


def cold_warm(config: SyncConfig, trainer, warm, cold, *, fault=None, capture=None, prompts=None,
              max_tokens: int = 8, previous=None, check_ids=None, probes: bool = False,
              receive=hashing, pack=pack) -> SyncResult:
    """The cold-vs-warm differential (R3): sync the trainer's current weights into `warm` (an engine that held
    other weights) and into `cold` (a fresh engine), measure both engines' outputs on fixed prompts, and run the
    catalog on the warm sync with the cold engine beside it. `receive`, `pack`: both syncs' (`run_sync`)."""
    from fp8check.invariants import run_catalog
    prompts = prompts or differential_prompts(config.spec.vocab_size)
    res = run_sync(config, trainer, warm, fault=fault, capture=capture, previous=previous, checks=False,
                   probes=probes, receive=receive, pack=pack)
    warm.measure_outputs(prompts, max_tokens)
    res.rollout.meta.serving = warm.record().serving
    cres = run_sync(config, trainer, cold, capture=capture, previous=previous, checks=False, master=False,
                    receive=receive, pack=pack)
    cold.measure_outputs(prompts, max_tokens)
    cres.rollout.meta.serving = cold.record().serving
    ctx = res.context()
    ctx.cold = cres.rollout
    res.findings = run_catalog(ctx, ids=check_ids)
    return res


def differential_prompts(vocab: int, n: int = 3, length: int = 40) -> list[list[int]]:
    """Fixed prompts long enough to fill whole KV-cache blocks (vLLM caches prefixes in 16-token blocks)."""
    return [[(17 * i + 31 * j + 7) % vocab for j in range(length)] for i in range(n)]


def reference_engines(config: SyncConfig, fault=None):
    """The CPU reference trainer and rollout for `config` (a rollout built by the fault when it must be)."""
    from ..engines.registry import make_engine
    trainer = make_engine("trainer", "cpu-reference", config)
    rollout = fault.apply(config, **fault.params) if builds_engine(fault) else \
        make_engine("rollout", "cpu-reference", config)
    return trainer, rollout


def reference_differential(config: SyncConfig, *, fault=None, check_ids=None, probes: bool = False,
                           receive=hashing, pack=pack) -> tuple[SyncResult, object, object]:
    """The cold-vs-warm differential with the reference engines: a warm engine syncs step 1 and serves the fixed
    prompts, the trainer steps, then step 2 goes (through `fault`) into the warm engine and into a fresh one.
    `receive`, `pack`: every sync's (`run_sync`)."""
    from ..engines.registry import make_engine
    trainer, warm = reference_engines(config, fault)
    trainer.optimizer_step()
    run_sync(config, trainer, warm, checks=False, master=False, receive=receive, pack=pack)
    warm.measure_outputs(differential_prompts(config.spec.vocab_size))
    previous = trainer.export_hf()
    trainer.optimizer_step()
    cold = make_engine("rollout", "cpu-reference", config)
    res = cold_warm(config, trainer, warm, cold, fault=fault, previous=previous, check_ids=check_ids, probes=probes,
                    receive=receive, pack=pack)
    return res, trainer, warm


def reference_sync(config: SyncConfig, *, steps: int = 1, fault=None, receive=hashing, pack=pack,
                   **kw) -> tuple[SyncResult, object, object]:
    """Build the reference trainer and rollout, take `steps` optimizer steps (syncing cleanly after all but the
    last one), then run the sync under test (`kw`: `run_sync`'s). `config`: as `fault_config` returned it.
    `receive`, `pack`: every sync's. Returns (result, trainer, rollout)."""
    trainer, rollout = reference_engines(config, fault)
    for s in range(steps):
        trainer.optimizer_step()
        if s < steps - 1:
            run_sync(config, trainer, rollout, resync=False, checks=False, master=False, receive=receive, pack=pack)
    # the export before the last step, made only if a fault reads it (the reference is deterministic in the step)
    previous = (lambda: trainer.export_hf_at(trainer.step - 1)) if steps else None
    result = run_sync(config, trainer, rollout, fault=fault, previous=previous, receive=receive, pack=pack, **kw)
    return result, trainer, rollout


__all__ = ["FaultContext", "NoTarget", "STAGES", "SyncResult", "builds_engine", "fault_config",
           "hashing", "install_items", "interceptors", "payload_snapshot", "reference_engines", "reference_sync",
           "run_sync", "DigestFirst", "FullRead"]
