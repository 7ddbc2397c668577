"""Live sessions: one trainer and one rollout engine for one config, each behind the remote wrapper (Ray actors
on the GPU machine: Megatron-Core/Transformer Engine and vLLM colocated on one GPU; or the CPU reference engines
in this process on a laptop), N optimizer steps with an on-policy sync after each, every sync through the one
pipeline (harness.sync.pipeline) with digest-first capture, policy probes on fixed prompts, and live fault
injection through the same fault registry the CPU matrix uses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from fp8check.harness.config import SyncConfig
from fp8check.harness.engines.remote import Remote
from fp8check.harness.snapshot import Snapshot, snapshot_manifest, write_snapshot_dir
from fp8check.harness.sync.pipeline import DigestFirst, NoTarget, fault_config, run_sync
from fp8check.invariants import FAIL, UNKNOWN


@dataclass
class SyncOutcome:
    label: str
    version: int
    findings: list
    fetched: int
    params: int
    seconds: dict
    engine_error: str | None = None
    probes: dict | None = None
    extra: dict = field(default_factory=dict)

    @property
    def fired(self) -> list[str]:
        return sorted({f.invariant_id for f in self.findings if f.verdict == FAIL})

    @property
    def unknown(self) -> list[str]:
        """Invariants that could not decide, except for a part the session's schedule deferred to its periodic
        syncs (`checks_every`: S7's idempotence), which the finding says and `extra["deferred"]` names."""
        return sorted({f.invariant_id for f in self.findings if f.verdict == UNKNOWN and not f.evidence.get("deferred")})

    def to_json(self) -> dict:
        return {"label": self.label, "version": self.version, "fired": self.fired, "unknown": self.unknown,
                "fetched_params": self.fetched, "params": self.params, "seconds": self.seconds,
                "engine_error": self.engine_error, "probes": self.probes, **self.extra,
                "findings": [f.to_json() for f in self.findings if f.verdict != "pass"][:12]}


class LiveSession:
    """A trainer and a rollout engine for one config. A context manager: leaving it (also on error) releases both
    engines and their GPU memory."""

    def __init__(self, config: SyncConfig, *, trainer: str = "megatron", rollout: str = "vllm", ray: bool = True,
                 num_gpus: float = 0.1, trainer_kwargs: dict | None = None, rollout_kwargs: dict | None = None,
                 trainer_engine=None, rollout_engine=None, device: bool = False, checks_every: int = 1,
                 warm: bool | None = None):
        """`trainer` / `rollout`: registered engine names, started behind the remote wrapper; or pass engines
        already running (`trainer_engine`, `rollout_engine`: anything with the protocol's methods), which the
        session then does not own. `device`: the device sync path (e2e.device): the pipeline runs in the
        trainer's process and the weights travel GPU to GPU (both engines Ray actors on one GPU).
        `checks_every`: checks left on for a whole run: every sync runs the catalog, and one sync in
        `checks_every` (the first, then every `checks_every`-th clean one; a fault sync always) also what costs as
        much as the sync itself (S7's re-sync, P1, C1: `run_sync(periodic=)`). `warm` (default: on the device
        path): one clean sync of the weights the engines started with, checks and all, before the first sync a
        caller makes (`warmup` holds its outcome): what a first call costs once -- memory the caching allocator
        grows into, cuBLAS and Triton choosing their kernels for the model's shapes -- is paid at start, so the
        first sync of a run costs what a later one does (on the H200 the first sync's catalog was 1.4-2.6x a
        later one's after the checks' kernels were compiled at start)."""
        if checks_every < 1:
            raise ValueError(f"checks_every must be >= 1, got {checks_every}")
        self.checks_every = checks_every
        self.profile = 0          # bench: the next sync on the device path profiled in the trainer's process (top N)
        self._clean_syncs = 0
        self.config = config
        self.device = device
        if device and not ray:
            raise ValueError("the device sync path needs both engines in Ray actors (ray=True)")
        t0 = time.perf_counter()
        self._owned = []
        try:
            if trainer_engine is None:
                trainer_engine = Remote("trainer", trainer, config, ray=ray, num_gpus=num_gpus, **(trainer_kwargs or {}))
                self._owned.append(trainer_engine)
            if rollout_engine is None:
                rollout_engine = Remote("rollout", rollout, config, ray=ray, num_gpus=num_gpus, **(rollout_kwargs or {}))
                self._owned.append(rollout_engine)
        except BaseException:
            self.close()
            raise
        self.trainer, self.rollout = trainer_engine, rollout_engine
        if device:                       # the capture and the checks run in the trainer's process: warm them there
            self.trainer.run_with_engine("fp8check.e2e.device:device_warm", config.recipe.name)
        self._rollout_spec = (rollout, ray, num_gpus, rollout_kwargs)
        self.start_seconds = time.perf_counter() - t0
        self.trainer_info = self.trainer.record().to_json()
        self.rollout_info = {"engine": self.rollout.engine, "knobs": sorted(self.rollout.knobs)}
        self.version = self.trainer_info["version"]
        self.previous_hf = None
        self.probe_bounds = None         # P1 bounds fixed before the run (None: P1 derives them per sync)
        self.last_clean = None
        self.warmup = None
        self.frozen_objects = None       # the device path: objects of the pipeline's process frozen after the warm-up
        if device if warm is None else warm:
            try:
                self.warmup = self.sync("warm-up")
            except BaseException:
                self.close()
                raise
            self._clean_syncs, self.last_clean = 0, None     # the schedule starts with the caller's first sync
        if device:                       # the pipeline's process: its startup heap out of every later collection
            self.frozen_objects = self.trainer.run_with_engine("fp8check.e2e.device:device_freeze_heap")

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def close(self):
        for e in reversed(self._owned):
            try:
                e.close()
            except Exception:  # noqa: BLE001 - release the others anyway
                pass
        self._owned = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def restart_rollout(self):
        """Replace the rollout engine with a fresh one (after a fault left it broken); only an engine this session
        started can be replaced."""
        if self.rollout not in self._owned:
            raise RuntimeError("the rollout engine was handed in: the session cannot replace it")
        name, ray, num_gpus, kw = self._rollout_spec
        self._owned.remove(self.rollout)
        self.rollout.close()
        self.rollout = Remote("rollout", name, self.config, ray=ray, num_gpus=num_gpus, **(kw or {}))
        self._owned.append(self.rollout)

    # -- the loop ------------------------------------------------------------------------------------------------
    def step(self) -> int:
        if self.device:                          # the previous export stays on the trainer's GPU
            self.version = self.trainer.run_with_engine("fp8check.e2e.device:device_step")
            self.previous_hf = {}
            return self.version
        self.previous_hf = self.trainer.export_hf()
        self.version = self.trainer.optimizer_step()
        return self.version

    def _device_sync(self, fault, naive, direct, probes, check_ids, resync=True, periodic=True, catalog=True):
        from fp8check.invariants import Finding
        out = self.trainer.run_with_engine(
            "fp8check.e2e.device:device_sync", self.rollout.handle, self.rollout.name, self.config.to_dict(),
            self.config.spec.to_dict(), fault=fault.name if fault else None, fault_params=fault.params if fault else None,
            naive=naive, direct=direct, probes=probes, probe_bounds=self.probe_bounds, check_ids=check_ids,
            resync=resync, periodic=periodic, profile=self.profile, catalog=catalog)
        out["findings"] = [Finding(**f) for f in out["findings"]]
        return out

    def sync(self, label: str = "clean", fault=None, naive: bool = False, probes: bool = False, check_ids=None,
             direct: bool = False, resync: bool = True, catalog: bool = True) -> SyncOutcome:
        """One sync of the trainer's current weights through the pipeline, optionally through a fault (it must be
        injectable into these running engines: `Fault.live_injectable`, else ValueError; an injector with nothing
        to corrupt raises `NoTarget`), then the checks. With `probes`, P1 judges
        the engines' own log-probs against a bound it derives for this sync from the trainer's bytes (never from
        an earlier sync's measurement); `probe_bounds`, set before the run, fixes the bounds instead. `resync=False`
        skips S7's idempotence probe (a second install of the same payload: it costs what the install costs), and S7
        says idempotence was not measured. `catalog=False`: the sync alone, nothing checked (a bench's baseline;
        it does not count in the schedule)."""
        if fault is not None and not fault.live_injectable(self.config, self.rollout.knobs):
            raise ValueError(f"{fault.name}: not injectable into the running engines (needs other engines)")
        probes = probes or (fault is not None and "P1" in fault.declared)    # its catch reads the engines' outputs
        if not catalog and fault is not None:
            raise ValueError("a fault sync is checked: catalog=False syncs clean weights only")
        periodic = fault is not None or self._clean_syncs % self.checks_every == 0
        if fault is None and catalog:
            self._clean_syncs += 1
        if self.device:
            d = self._device_sync(fault, naive, direct, probes, check_ids, resync, periodic, catalog)
            out = SyncOutcome(label, d["version"], d["findings"], d["fetched"], d["params"], d["seconds"],
                              d["errors"][0] if d["errors"] else None, d["probes"])
            out.extra.update(mismatching_params=d["mismatching"], payload_bytes=d["payload_bytes"], path="device",
                             deferred=d["deferred"], profile=d.get("profile"))
        else:
            cfg = fault_config(self.config, fault)
            res = run_sync(cfg, self.trainer, self.rollout, fault=fault, capture=DigestFirst(),
                           previous=self.previous_hf, naive=naive, direct=direct, probes=probes,
                           probe_bounds=self.probe_bounds, check_ids=check_ids, resync=resync, periodic=periodic,
                           catalog=catalog)
            if fault is None and not naive and not direct and catalog:
                self.last_clean = res                  # what `write_snapshot` records (the engine holds this sync)
            out = SyncOutcome(label, res.version, res.findings or [], res.fetched, res.params, res.seconds,
                              res.errors[0] if res.errors else None, res.probes)
            out.extra.update(mismatching_params=res.mismatching[:20], deferred=res.deferred)
        p1 = next((f for f in out.findings if f.invariant_id == "P1"), None)
        if p1 is not None:
            out.extra["probe_bounds"] = p1.evidence.get("bounds")
            out.extra["probe_floor"] = p1.evidence.get("floor")
            # each engine against its own reference (the learner's bytes; a perfect sync's engine)
            out.extra["probe_learner"] = p1.evidence.get("learner")
            out.extra["probe_sampler"] = p1.evidence.get("sampler")
        return out

    def write_snapshot(self, out: str) -> str:
        """The last clean sync as a snapshot directory that `fp8check verify` checks later, elsewhere: the
        learner's FP8 forward weights, the payload, and every parameter the sampler's kernels read, fetched in
        full from the engine (not the digest-first view). Reading never changes the engine."""
        res = self.last_clean
        if res is None:
            raise RuntimeError("no clean sync to snapshot yet: take a step and sync first")
        rollout = Snapshot("rollout", self.rollout.kernel_tensors(), res.rollout.meta)
        snaps = {"master": res.master, "trainer": res.trainer, "payload": res.payload, "rollout": rollout}
        write_snapshot_dir(out, snapshot_manifest(self.config, res.version, **snaps), **snaps)
        return f"wrote {out}/ (step {res.version}, {len(rollout.tensors)} engine parameters)"


def run_live(config: SyncConfig, steps: int, faults: list[str] = (), probes: bool = True,
             session: LiveSession | None = None, snapshot_dir: str | None = None, **session_kw) -> dict:
    """`fp8check live`: start both engines (unless a session is given), take `steps` optimizer steps with a
    checked sync after each, then inject the requested faults (each followed by a clean re-sync that must pass
    again); `snapshot_dir`: write the last clean sync there for `fp8check verify`. Engines it started are
    released on return, also on error."""
    from fp8check.faults import FAULTS
    own = session is None
    s = session or LiveSession(config, **session_kw)
    try:
        report = {"config": config.to_dict(), "start_seconds": round(s.start_seconds, 1), "trainer": s.trainer_info,
                  "rollout": s.rollout_info, "syncs": [], "faults": [],
                "warmup": s.warmup.to_json() if s.warmup is not None else None}
        for _ in range(steps):
            s.step()
            report["syncs"].append(s.sync(f"step {s.version}", probes=probes).to_json())
        for name in faults:
            f = FAULTS[name]
            if not f.live_injectable(config, s.rollout.knobs):
                report["faults"].append({"fault": name, "verdict": "n/a"})
                continue
            try:
                o = s.sync(name, fault=f)
            except NoTarget as e:              # the injector found nothing to corrupt here, and says why
                report["faults"].append({"fault": name, "verdict": "no target", "detail": str(e)})
                continue
            report["faults"].append({"fault": name, "must_trip": list(f.trips), "may_trip": list(f.may),
                                     "verdict": f.verdict(o.fired), "undeclared": f.undeclared(o.fired),
                                     **o.to_json()})
            # with the live probe: on the device path no snapshot reaches the host for P1 to run on
            again = s.sync(f"clean re-sync after {name}", probes=probes)
            report["syncs"].append(again.to_json())
            if (again.fired or again.unknown) and f.destructive and s.rollout in s._owned:
                # the fault broke the engine (the checks keep saying so): a fresh one for the next fault
                report["syncs"][-1]["engine_replaced"] = True
                s.restart_rollout()
                report["syncs"].append(s.sync(f"fresh engine after {name}", probes=probes).to_json())
        report["trainer_after"] = s.trainer.record().to_json()
        if snapshot_dir:
            report["snapshot"] = s.write_snapshot(snapshot_dir)
        return report
    finally:
        if own:
            s.close()
