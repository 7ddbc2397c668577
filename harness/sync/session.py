"""One weight sync through the CPU reference stack, end to end:

    trainer FP8 forward weights -> payload (manifest + tensors) -> byte buckets -> receive -> engine reload
    -> snapshots of both sides (+ idempotence re-sync)

Fault injectors act on exactly one of these stages through `SyncHooks`; a clean sync uses none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..config import SyncConfig
from ..formats.bytes import bits_equal
from ..snapshot.model import Snapshot

from .payload import Payload, build_payload
from .transport import ReceiveReport, pack, unpack


@dataclass
class SyncHooks:
    """Where a fault enters. Each is optional; all are pure functions except `engine` (it configures the
    reference engine before the sync, as a misbehaving engine would be)."""
    trainer: Callable | None = None      # (config, trainer_hf, trainer) -> the trainer's (faulty) FP8 weights
    make_rollout: Callable | None = None # (config) -> rollout engine (an engine built from other settings)
    payload: Callable | None = None      # (config, payload, ctx) -> payload
    buckets: Callable | None = None      # (config, list[bytes]) -> list[bytes]
    engine: Callable | None = None       # (config, rollout) -> None
    snapshot: Callable | None = None     # (config, rollout_snapshot) -> rollout_snapshot


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
    errors: list[str] = field(default_factory=list)


def _same_bits(a, b) -> bool:
    return b is not None and bits_equal(a, b)


def payload_snapshot(payload: Payload, report: ReceiveReport | None = None) -> Snapshot:
    meta = {"version": payload.version, "records": payload.manifest()}
    if report is not None:
        meta["receive"] = report.to_json()
    return Snapshot("payload", dict(payload.tensors), meta)


def sync_once(config: SyncConfig, trainer, rollout, *, hooks: SyncHooks | None = None, poison: bool = True,
              resync: bool = True, previous: dict | None = None) -> SyncResult:
    """Run one sync of the trainer's current weights into `rollout` and capture everything the checks read.

    `previous`: the trainer's HF export before its last step (faults that mix versions draw from it).
    """
    hooks = hooks or SyncHooks()
    version = trainer.step
    errors: list[str] = []
    trainer_hf = trainer.export_hf()
    if hooks.trainer:
        trainer_hf = hooks.trainer(config, dict(trainer_hf), trainer)
    sent = build_payload(config, trainer_hf, version)
    if hooks.payload:
        sent = hooks.payload(config, sent, {"previous": previous, "trainer": trainer})
    buckets = pack(sent, config.transport.bucket_bytes)
    if hooks.buckets:
        buckets = hooks.buckets(config, buckets)
    received, report = unpack(buckets, config.transport.verify_digests)
    if hooks.engine:
        hooks.engine(config, rollout)
    if poison:
        rollout.poison()

    def install():
        items = [(r.name, received.tensors[r.name], r.version) for r in received.records if r.name in received.tensors]
        return rollout.reload_weights(items, version=version)

    try:
        install()
    except Exception as e:  # noqa: BLE001 - the engine refused; the checks judge the state it left
        errors.append(f"install: {e}")
    meta = rollout.metadata()
    kernel = rollout.kernel_tensors()
    if resync and not errors:
        # idempotence (S7): installing the same payload again must leave every kernel tensor unchanged
        try:
            install()
            after = rollout.kernel_tensors()
            meta["resync"] = {"changed": sorted(n for n, t in kernel.items() if not _same_bits(t, after.get(n)))}
        except Exception as e:  # noqa: BLE001
            meta["resync"] = {"error": str(e)}
    meta["errors"] = errors
    meta["version"] = version
    meta["poisoned"] = poison
    rollout_snap = Snapshot("rollout", kernel, meta)
    if hooks.snapshot:
        rollout_snap = hooks.snapshot(config, rollout_snap)
    trainer_snap = Snapshot("trainer", dict(trainer_hf), {"engine": trainer.engine, "version": version,
                                                         "fp8_param": config.trainer.fp8_param})
    return SyncResult(config, version, sent, received, report, trainer_snap, rollout_snap,
                      payload_snapshot(received, report), errors)


def reference_sync(config: SyncConfig, *, steps: int = 1, hooks: SyncHooks | None = None, poison: bool = True,
                   resync: bool = True) -> tuple[SyncResult, object, object]:
    """Build the reference trainer and rollout, take `steps` optimizer steps (syncing after all but the last
    one cleanly), then run the sync under test. Returns (result, trainer, rollout)."""
    from ..engines.cpu.rollout import ReferenceRollout
    from ..engines.cpu.trainer import ReferenceTrainer
    hooks = hooks or SyncHooks()
    trainer = ReferenceTrainer(config)
    rollout = hooks.make_rollout(config) if hooks.make_rollout else ReferenceRollout(config)
    previous = None
    for s in range(steps):
        previous = trainer.export_hf()
        if s < steps - 1:
            trainer.optimizer_step()
            sync_once(config, trainer, rollout, poison=poison, resync=False)
        else:
            trainer.optimizer_step()
    result = sync_once(config, trainer, rollout, hooks=hooks, poison=poison, resync=resync, previous=previous)
    return result, trainer, rollout
