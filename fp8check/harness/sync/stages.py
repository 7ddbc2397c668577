"""The stages of the one road (docs/design.md, "The one road"), each written once and composed by its drivers:

    export -> send (payload -> buckets -> receive) -> install -> capture (record + state) -> resync -> check

* `pipeline.run_sync`: fp8check's own sync, every stage (S1's poison started before the wire, waited for before
  the install);
* `integrations.check.check_sync`: observe-only, capture and check over a sync the user's job performed;
* the pytest plugin's `SyncChecker`: the user's function is the send and the install; capture, resync and check
  are these.

A stage never reads a fault. What a fault does to one sync reaches the stages as `Interceptors`, which the
pipeline builds from the fault once (`pipeline.interceptors`, the one reader of a fault's stage).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..config import SyncConfig
from ..engines.remote import runs_apart, start_call
from ..record import EngineRecord, Resync, TrainerRecord
from ..snapshot.model import Snapshot
from .capture import Captured, ahead_held, start_ahead
from .payload import Payload, build_payload
from .timing import Clock
from .transport import ReceiveReport, hashing, pack


@dataclass(frozen=True)
class Interceptors:
    """Where one sync is corrupted, each at the stage that calls it (None: that stage runs as written)."""
    on_trainer: Callable | None = None     # (config, hf, ctx) -> hf: the learner itself holds other bytes
    on_payload: Callable | None = None     # (config, payload, ctx) -> payload: the sender's bugs
    on_buckets: Callable | None = None     # (config, buckets) -> buckets: transport damage
    engine_knobs: dict | None = None       # knobs the engine takes for this sync's installs
    serving: dict | None = None            # the serving cycle before the install (`serving_cycle`'s knobs)


@dataclass
class Exported:
    """The learner's side of one sync: its record, its FP8 forward export (HF names), its masters (None when the
    caller asked for none)."""
    record: TrainerRecord
    hf: dict
    master_hf: dict | None


def export(trainer, master: bool) -> Exported:
    trecord = trainer.record()
    return Exported(trecord, trainer.export_hf(), trainer.master_hf() if master else None)


def start_poison(rollout):
    """S1's sentinel written into every destination, started (`start_call`; `.result()` before the install): an
    engine in its own process fills its parameters while this process builds the wire."""
    return start_call(rollout, "poison")


@dataclass
class Wire:
    """What `send` made: the learner's bytes it started from (after a trainer interceptor), the payload as sent,
    and as the receiver decoded and verified it."""
    trainer_hf: dict
    sent: Payload
    received: Payload
    report: ReceiveReport


def send(config: SyncConfig, trainer_hf: dict, version: int, masters, fctx, hooks: Interceptors, *,
         naive: bool = False, receive=hashing, pack=pack) -> Wire:
    """The learner's export through the wire: payload (its digests), buckets, the receiver's decode and digest
    check (`receive(buckets, verify_digests, sent)`: `transport.hashing`, or a caller's strategy, with the
    `pack(payload, bucket_bytes)` that goes with it, `transport.pack` by default). `masters`: the BF16/FP32
    masters, or a callable that makes them (called only where the wire carries them). `naive`: the round trip (the
    FP8 forward dequantized for the engine to quantize again)."""
    if hooks.on_trainer is not None:                   # the learner itself holds these bytes
        trainer_hf = hooks.on_trainer(config, dict(trainer_hf), fctx)
        fctx.trainer_hf = trainer_hf
    wire_config = replace(config, sync_mode="naive") if naive else config
    if callable(masters):
        masters = None if wire_config.fp8_on_wire else masters()
    sent = build_payload(wire_config, trainer_hf, version, masters)
    if hooks.on_payload is not None:
        sent = hooks.on_payload(config, sent, fctx)
    buckets = pack(sent, config.transport.bucket_bytes)
    if hooks.on_buckets is not None:
        buckets = hooks.on_buckets(config, buckets)
    received, report = receive(buckets, config.transport.verify_digests, sent)
    return Wire(trainer_hf, sent, received, report)


def install_items(received: Payload) -> list:
    """(name, tensor, version) for every received tensor, in wire order: what an install writes."""
    return [(r.name, received.tensors[r.name], r.version) for r in received.records if r.name in received.tensors]


@dataclass
class Begun:
    """What `begin_capture` started while the install runs."""
    recording: object = None        # the record's call queued behind the install (an engine in its own process)
    screening: object = None        # S3's screens of the trainer's tensors (a Future, or None)
    seconds: float = 0.0            # the time it took to start them (counted with the capture)


def begin_capture(capture, config: SyncConfig, rollout, trainer_hf: dict, poisoned: bool, *, apart: bool,
                  screens: bool, on_cpu: bool = False) -> Begun:
    """The capture's expected side (`capture.begin`) and, with `screens`, S3's screens of the trainer's tensors,
    handed to the background thread (they start when every hand-off is made, `ahead_held`); where the engine runs
    `apart`, its record's call is queued behind the install. `on_cpu`: the thread on CPU tensors too."""
    with ahead_held():
        recording = capture.start_record(rollout) if apart else None    # begins the moment the install ends
        capture.begin(config, trainer_hf, poisoned, on_cpu=on_cpu)      # from the trainer's bytes alone
        screening = start_screens(config, trainer_hf, on_cpu) if screens else None
    return Begun(recording, screening)


def install(rollout, items: list, version: int, *, clock: Clock, direct: bool = False, knobs=None, poisoning=None,
            beside: Callable | None = None) -> tuple[list, Begun]:
    """Wait for the poison, then install `items` (started first: an engine in its own process gets it at once,
    before this process's background thread holds the interpreter); `beside(apart)` -> `Begun` runs while it
    does. Returns (errors: the engine's refusal, which the checks judge by the state it left; what was begun).
    Times `poison` (its wait) and `install` (an engine in this process installed before `beside`: not counted)."""
    if poisoning is not None:
        with clock("poison"):
            poisoning.result()
    apart = runs_apart(rollout)
    t1 = time.perf_counter()
    installing = start_call(rollout, "install", items, version, direct=direct, knobs=knobs)
    tb = time.perf_counter()
    begun = beside(apart) if beside is not None else Begun()
    begun.seconds = time.perf_counter() - tb
    errors = []
    try:
        installing.result()
    except Exception as e:  # noqa: BLE001 - the engine refused; the checks judge the state it left
        errors.append(f"install: {e}")
    clock.add("install", time.perf_counter() - t1 - (0.0 if apart else begun.seconds))
    return errors, begun


def capture_state(capture, config: SyncConfig, rollout, trainer_hf: dict, *, clock: Clock, begun: Begun | None = None,
                  poisoned: bool | None = None) -> tuple[EngineRecord, Captured]:
    """The engine's record (the call `begun` queued, else started here) and its state, read by the `capture`
    strategy against `trainer_hf`. `poisoned`: set on the record before the capture (a digest-first one screens
    for survivors, S1); None leaves the engine's word. Times `capture` (with what was begun), its parts, and the
    garbage collector's pauses inside it (`capture.gc`)."""
    begun = begun or Begun()
    t2 = time.perf_counter()
    with clock.gc("capture.gc"):
        recording = begun.recording or capture.start_record(rollout)      # with what the capture reads beside it
        record: EngineRecord = recording.result()
        recorded = time.perf_counter() - t2
        if poisoned is not None:
            record.poisoned = poisoned
        got: Captured = capture.capture(config, rollout, trainer_hf, record)
    clock.add("capture", time.perf_counter() - t2 + begun.seconds)
    clock.update(got.seconds, "capture.")
    clock.t["capture.begin"], clock.t["capture.record"] = begun.seconds, recorded
    clock.update(record.seconds, "capture.record.")                   # the engine's side of it
    if getattr(recording, "reply_seconds", None) is not None:         # the reply's leg back from the engine's process
        clock.t["capture.record.reply"] = recording.reply_seconds
    return record, got


def rollout_snapshot(got: Captured, record: EngineRecord) -> Snapshot:
    return Snapshot("rollout", got.tensors, record, got.specs, got.proof)


def resync(config: SyncConfig, capture, rollout, got: Captured, names, install_again: Callable[[], None]) -> Resync:
    """Idempotence (S7): the same sync again (`install_again()`) must leave every kernel tensor it writes unchanged;
    returns the written ones that changed (`names`: what the sync wrote; what it leaves unwritten is undefined on
    vLLM, S1's), or the error that stopped the second install."""
    before = capture.before_resync(rollout, got)
    try:
        install_again()
        written = config.layout.written_by(names)
        return Resync([n for n in capture.changed(rollout, before) if n in written])
    except Exception as e:  # noqa: BLE001 - S7 judges a second install that failed
        return Resync(error=str(e))


def start_screens(config: SyncConfig, trainer_hf: dict, on_cpu: bool = False):
    """S3's screens of the trainer's tensors (`trainer_screens`) begun beside the install where the trainer's
    tensors are on a GPU, or with `on_cpu` (None elsewhere: S3 screens them itself)."""
    from fp8check.invariants.screens import trainer_screens
    return start_ahead(lambda: trainer_screens(config, trainer_hf), trainer_hf, on_cpu=on_cpu)


def _screens(screening):
    """The screens begun beside the install, or None (S3 then screens every tensor itself, and says why not if it
    cannot either)."""
    if screening is None:
        return None
    try:
        return screening.result()
    except Exception:  # noqa: BLE001 - a screen that failed ahead is computed again by the check, which judges it
        return None


def probe(trainer, rollout, prompts):
    """The learner's and the engine's log-probs on the probe prompts (`ProbeRun`, what P1 judges). An engine a
    fault left unable to generate gives a run with its error: P1 unknown, never a crash and never a pass."""
    from fp8check.invariants.probes import ProbeRun
    try:
        return ProbeRun(prompts, trainer.logprobs(prompts), rollout.generate_logprobs(prompts))
    except Exception as e:  # noqa: BLE001 - e.g. layers left on the meta device (seen on the H200)
        msg = (str(e).splitlines() or [""])[0][:300]
        return ProbeRun(prompts, None, None, error=f"{e.__class__.__name__}: {msg}")


@dataclass
class Checked:
    findings: list
    ran: dict = field(default_factory=dict)        # invariant id -> seconds, for those that ran


def check(ctx, *, ids=None, force: bool = True, periodic: bool = True, screening=None,
          clock: Clock | None = None) -> Checked:
    """The catalog over `ctx` (`run_catalog`'s `ids`, `force`, `periodic`), with the screens begun beside the
    install handed to it (`ctx.screens`, when `screening` was begun). Times `checks`, `checks.screens_wait`,
    `checks.gc` and each invariant (`check.<id>`)."""
    from fp8check.invariants import run_catalog
    clock = clock or Clock()
    t4 = time.perf_counter()
    by_id: dict = {}
    with clock.gc("checks.gc"):
        if screening is not None:
            ctx.screens = _screens(screening)
        clock.t["checks.screens_wait"] = time.perf_counter() - t4
        findings = run_catalog(ctx, ids=ids, force=force, timings=by_id, periodic=periodic)
    clock.t["checks"] = time.perf_counter() - t4
    clock.update(by_id, "check.")
    return Checked(findings, by_id)


__all__ = ["Begun", "Checked", "Exported", "Interceptors", "Wire", "begin_capture", "capture_state", "check",
           "export", "install", "install_items", "probe", "resync", "rollout_snapshot", "send", "start_poison",
           "start_screens"]
