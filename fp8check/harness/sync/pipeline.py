"""The one road every sync takes (docs/design.md, "One road"):

    export -> payload -> buckets -> poison -> install -> capture -> checks

(S1's poison is started right after the export and waited for before the install: an engine in its own process
fills its parameters while the payload is built. The capture's expected side begins before the install.)

`run_sync` drives one weight sync from any trainer into any rollout engine (the engine protocol: in process or
behind the remote wrapper), and is the only code that interprets a fault's stage. `fp8check faults`, `snapshot`,
`bench`, `live`, `preflight --probe`, the end-to-end RL loop and users' `check_sync` all run through it; the one
real difference between them, how the engine state is captured (full read vs digest-first), is a strategy
(harness.sync.capture).

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

import gc
import time
from dataclasses import dataclass, field, replace

from ..config import SyncConfig
from ..engines.remote import runs_apart, start_call
from ..layouts import LayoutError
from ..record import EngineRecord, PayloadMeta, Resync, TrainerRecord
from ..snapshot.model import Snapshot
from .capture import Captured, DigestFirst, FullRead, ahead_held, start_ahead
from .payload import Payload, build_payload
from .transport import ReceiveReport, pack, unpack

STAGES = ("config", "trainer", "payload", "buckets", "engine", "serving")


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
    if fault.stage == "config":
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
    return fault is not None and fault.stage == "engine" and not fault.knobs


def payload_snapshot(payload: Payload, report: ReceiveReport | None = None) -> Snapshot:
    return Snapshot("payload", dict(payload.tensors), PayloadMeta(payload.version, list(payload.records), report))


def install_items(received: Payload) -> list:
    return [(r.name, received.tensors[r.name], r.version) for r in received.records if r.name in received.tensors]


def run_sync(config: SyncConfig, trainer, rollout, *, fault=None, capture=None, previous: dict | None = None,
             poison: bool = True, resync: bool = True, naive: bool = False, direct: bool = False,
             master: bool = True, checks: bool = True, check_ids=None, probes: bool = False, probe_bounds=None,
             prompts=None, periodic: bool = True, catalog: bool = True) -> SyncResult:
    """One sync of the trainer's current weights into `rollout`, then the catalog.

    `config`: as `fault_config` returned it (the engines were built from it). `previous`: the trainer's export
    before its last step, or a callable that makes it (faults that mix versions draw from it). `naive`: the
    failure mode the tool exists for (the FP8 forward weight dequantized to BF16 and quantized again by the
    engine). `direct`: install through
    the model's own load_weights. `capture`: FullRead (default) or DigestFirst. `periodic=False`: a schedule's
    cheap sync (checks left on for every sync of a run): what costs as much as the sync itself -- S7's re-sync, the
    periodic invariants (P1's forwards, C1's requantization) -- is left to the periodic syncs and named in
    `SyncResult.deferred`. `catalog=False`: the sync alone -- no poison, no record, no capture, no checks -- the
    baseline a bench measures what the catalog adds against (the catalog overlaps the wire and the install)."""
    if fault is not None and fault.stage not in STAGES:
        raise ValueError(f"fault {fault.name}: unknown stage {fault.stage!r}")
    capture = capture or FullRead()
    stage = fault.stage if fault is not None else None
    params = fault.params if fault is not None else {}
    t, errors = {}, []
    t0 = time.perf_counter()
    trecord: TrainerRecord = trainer.record()
    version = trecord.version
    trainer_hf = trainer.export_hf()
    master_hf = trainer.master_hf() if master else None
    t["export"] = time.perf_counter() - t0
    if prompts is None:
        from fp8check.invariants.probes import prompts_for
        prompts = prompts_for(config.spec.vocab_size)
    if stage == "serving":
        serving_cycle(rollout, fault.knobs, prompts)
    poisoning = None
    poison = poison and catalog
    if poison:                             # S1's sentinel: a check's cost, not the install's; started before the
        tp = time.perf_counter()           # wire, so that an engine in its own process fills while it is built
        poisoning = start_call(rollout, "poison")
        t["poison"] = time.perf_counter() - tp
    tw = time.perf_counter()
    fctx = FaultContext(config, trainer_hf, previous, master_hf if master else trainer.master_hf)
    if stage == "trainer":                               # the learner itself holds these bytes
        trainer_hf = fault.apply(config, dict(trainer_hf), fctx, **params)
        fctx.trainer_hf = trainer_hf
    wire_config = replace(config, sync_mode="naive") if naive else config
    sent = build_payload(wire_config, trainer_hf, version,
                         master_hf if master_hf is not None or wire_config.fp8_on_wire else trainer.master_hf())
    if stage == "payload":
        sent = fault.apply(config, sent, fctx, **params)
    buckets = pack(sent, config.transport.bucket_bytes)
    if stage == "buckets":
        buckets = fault.apply(config, buckets, **params)
    # the reference engine receives beside the sender: the digest check may compare bytes with the sender's
    # (the same answer, _digest_ok); a real engine's receive stays exactly as it was measured
    beside = getattr(type(rollout), "in_process_wire", False) is True      # a class attribute, never a proxy's
    received, report = unpack(buckets, config.transport.verify_digests, sent=sent.tensors if beside else None)
    # the wire: the payload with its digests, the buckets, the receiver's decode and digest check
    t["wire"] = time.perf_counter() - tw
    items = install_items(received)
    if naive:
        items = rollout.quantize_online(items)
    knobs = dict(fault.knobs) if stage == "engine" and fault.knobs else None
    if poisoning is not None:             # the engine filled its parameters while the wire was built
        tp = time.perf_counter()
        poisoning.result()
        t["poison"] += time.perf_counter() - tp
    # the install started first: an engine in its own process gets it at once, before this process's background
    # thread (the capture's expected side, S3's screens) holds the interpreter for milliseconds at a time (waiting
    # for it, the request waited up to the interpreter's 5 ms switch interval)
    apart = runs_apart(rollout)
    t1 = time.perf_counter()
    installing = start_call(rollout, "install", items, version, direct=direct, knobs=knobs)
    tb = time.perf_counter()
    screening = recording = None
    if catalog:
        with ahead_held():                 # the background thread's work starts once these hand-offs are made
            if apart:  # the record's call queued behind the install (its calls run in the order started): it
                recording = capture.start_record(rollout)     # begins there the moment the install ends
            # the capture's expected side, from the trainer's bytes alone (it overlaps the install)
            capture.begin(config, trainer_hf, poison)
            if checks and (check_ids is None or "S3" in check_ids):   # S3's screens of the trainer's tensors
                screening = _start_screens(config, trainer_hf)
    begun = time.perf_counter() - tb       # the capture's: counted with it below
    try:
        installing.result()
    except Exception as e:  # noqa: BLE001 - the engine refused; the checks judge the state it left
        errors.append(f"install: {e}")
    # the install's wall; an engine in this process installed before the capture began (counted there)
    t["install"] = time.perf_counter() - t1 - (0.0 if apart else begun)
    if not catalog:
        res = SyncResult(config, version, sent, received, report, Snapshot("trainer", dict(trainer_hf), trecord),
                         Snapshot("rollout", {}, None), payload_snapshot(received, report), None, errors)
        res.seconds = {k: round(v, 4) for k, v in t.items()}
        return res
    t2 = time.perf_counter()
    mem = _cuda_memory()
    gc_capture = _GCPauses().start()
    try:
        recording = recording or capture.start_record(rollout)       # with what the capture reads beside it
        record: EngineRecord = recording.result()
        recorded = time.perf_counter() - t2
        record.poisoned = poison               # before the capture: a digest-first one screens for survivors (S1)
        got: Captured = capture.capture(config, rollout, trainer_hf, record)
    finally:
        t["capture.gc"] = gc_capture.stop()
    t["capture"] = time.perf_counter() - t2 + begun
    t.update({f"capture.{k}": v for k, v in got.seconds.items()})
    t["capture.begin"], t["capture.record"] = begun, recorded
    t.update({f"capture.record.{k}": v for k, v in record.seconds.items()})    # the engine's side of it
    if getattr(recording, "reply_seconds", None) is not None:    # the reply's leg back from the engine's process
        t["capture.record.reply"] = recording.reply_seconds
    if not periodic:
        record.resync = Resync(deferred=True)
    elif resync and not errors:
        # idempotence (S7): installing the same payload again must leave every kernel tensor unchanged; one more
        # install, by definition as dear as one (timed apart)
        t5 = time.perf_counter()
        before = capture.before_resync(rollout, got)
        try:
            rollout.install(items, version, direct=direct, knobs=knobs)
            # judged where the sync writes every element (what it leaves unwritten is undefined on vLLM: S1's)
            written = config.layout.written_by(n for n, *_ in items)
            record.resync = Resync([n for n in capture.changed(rollout, before) if n in written])
        except Exception as e:  # noqa: BLE001
            record.resync = Resync(error=str(e))
        t["resync"] = time.perf_counter() - t5
    record.version, record.errors = version, errors
    if mem is not None:                  # what capture (with the re-sync) added; the checks' own peak below
        import torch
        t["capture_extra_peak_bytes"] = int(torch.cuda.max_memory_allocated() - mem)
        mem_checks = _cuda_memory()       # probes, then checks, from here
    res = SyncResult(config, version, sent, received, report,
                     Snapshot("trainer", dict(trainer_hf), replace(trecord, fp8_param=config.trainer.fp8_param)),
                     Snapshot("rollout", got.tensors, record, got.specs, got.proof), payload_snapshot(received, report),
                     Snapshot("master", master_hf) if master_hf is not None else None, errors,
                     got.fetched, got.params, got.mismatching)
    if probes and periodic:               # the engines' probe feeds P1 alone, a periodic invariant
        from fp8check.invariants.probes import ProbeRun
        t3 = time.perf_counter()
        try:
            res.probe_run = ProbeRun(prompts, trainer.logprobs(prompts), rollout.generate_logprobs(prompts))
        except Exception as e:  # noqa: BLE001 - an engine a fault left broken (layers on the meta device: seen on
            # the H200) cannot generate: the probe is unknown, never a crash and never a pass
            msg = (str(e).splitlines() or [""])[0][:300]
            res.probe_run = ProbeRun(prompts, None, None, error=f"{e.__class__.__name__}: {msg}")
        res.probes = res.probe_run.metrics
        t["probes"] = time.perf_counter() - t3
    if checks:
        from fp8check.invariants import run_catalog
        t4 = time.perf_counter()
        by_id: dict = {}
        gc_checks = _GCPauses().start()
        try:
            res.screens = _screens(screening)
            t["checks.screens_wait"] = time.perf_counter() - t4
            res.findings = run_catalog(res.context(probe_bounds), ids=check_ids, timings=by_id, periodic=periodic)
        finally:
            t["checks.gc"] = gc_checks.stop()
        if not periodic:
            from fp8check.invariants import REGISTRY
            res.deferred = ["S7:idempotence"] + [i for i, inv in REGISTRY.items() if inv.periodic and i not in by_id]
        t["checks"] = time.perf_counter() - t4
        t.update({f"check.{k}": v for k, v in by_id.items()})
    if mem is not None and checks:
        import torch
        t["checks_extra_peak_bytes"] = int(torch.cuda.max_memory_allocated() - mem_checks)
    if mem is not None:                   # over the sync's own memory: capture's peak, or what it kept + the checks'
        t["check_extra_peak_bytes"] = max(t["capture_extra_peak_bytes"],
                                          mem_checks - mem + t.get("checks_extra_peak_bytes", 0))
    res.seconds = {k: (v if k.endswith("_bytes") else round(v, 4)) for k, v in t.items()}
    return res


def _start_screens(config: SyncConfig, trainer_hf: dict):
    """`invariants.sync.trainer_screens` begun beside the install where the trainer's tensors are on a GPU (None
    elsewhere: S3 screens them itself)."""
    from fp8check.invariants.sync import trainer_screens
    return start_ahead(lambda: trainer_screens(config, trainer_hf), trainer_hf)


def _screens(screening):
    """The screens begun beside the install, or None (S3 then screens every tensor itself, and says why not if it
    cannot either)."""
    if screening is None:
        return None
    try:
        return screening.result()
    except Exception:  # noqa: BLE001 - a screen that failed ahead is computed again by the check, which judges it
        return None


class _GCPauses:
    """Seconds the garbage collector held this process between `start` and `stop` (`gc.callbacks`, any thread): a
    collection of the oldest generation walks every object the process tracks, a trainer's whole heap, and lands
    in whichever timed part allocated last (S3 at Qwen3-30B-A3B x 4 on the H200: 47 ms in one sync, 355 and 447
    in two others alike; reported as `capture.gc` and `checks.gc` to say whether that is where it went)."""

    def __init__(self):
        self.seconds, self._t0 = 0.0, None

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    def start(self) -> "_GCPauses":
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> float:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        return self.seconds


def _cuda_memory():
    """This process's allocated CUDA memory now, with the peak counter reset (None without CUDA in use)."""
    try:
        import torch
        if not torch.cuda.is_initialized():
            return None
        # the allocator's counters are the host's: no synchronize (it would wait here, untimed, for the expected
        # digests the capture began before the install)
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    except Exception:  # noqa: BLE001 - measuring is optional
        return None


def cold_warm(config: SyncConfig, trainer, warm, cold, *, fault=None, capture=None, prompts=None,
              max_tokens: int = 8, previous=None, check_ids=None, probes: bool = False) -> SyncResult:
    """The cold-vs-warm differential (R3): sync the trainer's current weights into `warm` (an engine that held
    other weights) and into `cold` (a fresh engine), measure both engines' outputs on fixed prompts, and run the
    catalog on the warm sync with the cold engine beside it."""
    from fp8check.invariants import run_catalog
    prompts = prompts or differential_prompts(config.spec.vocab_size)
    res = run_sync(config, trainer, warm, fault=fault, capture=capture, previous=previous, checks=False,
                   probes=probes)
    warm.measure_outputs(prompts, max_tokens)
    res.rollout.meta.serving = warm.record().serving
    cres = run_sync(config, trainer, cold, capture=capture, previous=previous, checks=False, master=False)
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


def reference_differential(config: SyncConfig, *, fault=None, check_ids=None, probes: bool = False
                           ) -> tuple[SyncResult, object, object]:
    """The cold-vs-warm differential with the reference engines: a warm engine syncs step 1 and serves the fixed
    prompts, the trainer steps, then step 2 goes (through `fault`) into the warm engine and into a fresh one."""
    from ..engines.registry import make_engine
    trainer, warm = reference_engines(config, fault)
    trainer.optimizer_step()
    run_sync(config, trainer, warm, checks=False, master=False)
    warm.measure_outputs(differential_prompts(config.spec.vocab_size))
    previous = trainer.export_hf()
    trainer.optimizer_step()
    cold = make_engine("rollout", "cpu-reference", config)
    res = cold_warm(config, trainer, warm, cold, fault=fault, previous=previous, check_ids=check_ids, probes=probes)
    return res, trainer, warm


def reference_sync(config: SyncConfig, *, steps: int = 1, fault=None, **kw) -> tuple[SyncResult, object, object]:
    """Build the reference trainer and rollout, take `steps` optimizer steps (syncing cleanly after all but the
    last one), then run the sync under test. `config`: as `fault_config` returned it. Returns
    (result, trainer, rollout)."""
    trainer, rollout = reference_engines(config, fault)
    for s in range(steps):
        trainer.optimizer_step()
        if s < steps - 1:
            run_sync(config, trainer, rollout, resync=False, checks=False, master=False)
    # the export before the last step, made only if a fault reads it (the reference is deterministic in the step)
    previous = (lambda: trainer.export_hf_at(trainer.step - 1)) if steps else None
    result = run_sync(config, trainer, rollout, fault=fault, previous=previous, **kw)
    return result, trainer, rollout


__all__ = ["FaultContext", "NoTarget", "STAGES", "SyncResult", "builds_engine", "fault_config", "install_items",
           "payload_snapshot", "reference_engines", "reference_sync", "run_sync", "DigestFirst", "FullRead"]
