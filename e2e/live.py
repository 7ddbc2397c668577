"""Live scenarios on real engines (GPU): trainer (Megatron-Core + Transformer Engine) and vLLM colocated on one
GPU as Ray workers; N optimizer steps with an on-policy sync after each; the whole catalog checked after every
sync, digest-first (device digests of every engine parameter against the expected bytes; only mismatching
parameters are fetched); policy probes on fixed prompts; live fault injection through the same fault
injectors the CPU matrix uses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from harness.config import SyncConfig
from harness.engines.digest import SEEDS, device_digest
from harness.engines.vllm_numerics import post_load_requant
from harness.layouts import is_scale_name, rank_name, scale_name
from harness.snapshot import Snapshot, snapshot_manifest, write_snapshot_dir
from harness.sync.payload import build_payload
from harness.sync.session import payload_snapshot
from harness.sync.transport import pack, unpack
from invariants import CheckContext, FAIL, UNKNOWN, run_catalog
from invariants.probes import PROMPTS, calibrated_bounds, probe_metrics


def _with_bounds(ctx, bounds):
    ctx.probe_bounds = bounds
    return ctx


def expected_engine_state(config: SyncConfig, trainer_hf: dict) -> dict:
    """What every rollout parameter must hold after a correct sync of `trainer_hf`: the layout applied, then the
    engine's declared post-load transform (vLLM names, tp-prefixed when sharded)."""
    out = {}
    for r in range(config.rollout.tp_size):
        params = config.layout.hf_to_vllm(trainer_hf, r)
        for n, t in params.items():
            if is_scale_name(n):
                continue
            if scale_name(n) in params:
                q, s = post_load_requant(config, n, t, params[scale_name(n)])
                out[rank_name(n, r, config.rollout.tp_size)] = q
                out[rank_name(scale_name(n), r, config.rollout.tp_size)] = s
            else:
                out[rank_name(n, r, config.rollout.tp_size)] = t.to(torch.bfloat16)
    return out


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
        return sorted({f.invariant_id for f in self.findings if f.verdict == UNKNOWN})

    def to_json(self) -> dict:
        return {"label": self.label, "version": self.version, "fired": self.fired, "unknown": self.unknown,
                "fetched_params": self.fetched, "params": self.params, "seconds": self.seconds,
                "engine_error": self.engine_error, "probes": self.probes, **self.extra,
                "findings": [f.to_json() for f in self.findings if f.verdict != "pass"][:12]}


class LiveSession:
    """One trainer worker and one rollout worker for one config."""

    def __init__(self, config: SyncConfig, workdir: str, trainer=None, rollout=None, ignored_layers=None,
                 fp8_source: str = "megatron", ray_module=None):
        from harness.ray_workers import RayWire, rollout_actor, trainer_actor
        if ray_module is None:
            ray_module = RayWire
        ray = self.ray = ray_module
        self.config = config
        t0 = time.perf_counter()
        self.trainer = trainer or trainer_actor(config, fp8_source=fp8_source)
        self.rollout = rollout or rollout_actor(config, workdir, ignored_layers=ignored_layers)
        self.rollout_info = ray.get(self.rollout.ready.remote())
        self.trainer_info = ray.get(self.trainer.info.remote())
        self.start_seconds = time.perf_counter() - t0
        self.version = self.trainer_info["step"]
        self.previous_hf = None
        self.probe_bounds = None
        self.last_clean = None

    def step(self) -> int:
        self.previous_hf = self.ray.get(self.trainer.export_hf.remote())
        self.version = self.ray.get(self.trainer.step.remote())
        return self.version

    def sync(self, label: str = "clean", fault=None, naive: bool = False, probes: bool = False,
             check_ids=None, direct: bool = False) -> SyncOutcome:
        """One sync of the trainer's current weights, optionally through a fault, then the checks. direct=True
        installs through the model's own load_weights (no reload bookkeeping, no post-load), as some RL stacks do."""
        ray, cfg = self.ray, self.config
        t = {}
        t0 = time.perf_counter()
        trainer_hf = ray.get(self.trainer.export_hf.remote())
        master = ray.get(self.trainer.master_hf.remote())
        t["export"] = time.perf_counter() - t0
        repeats, sent_hf = 1, trainer_hf
        if fault is not None and fault.stage == "trainer":
            sent_hf = fault.apply(cfg, dict(trainer_hf), _MasterView(master), **fault.params)
            trainer_hf = sent_hf                  # the learner itself holds these bytes
        payload = build_payload(cfg if not naive else replace(cfg, sync_mode="naive"), sent_hf, self.version)
        if fault is not None and fault.stage == "payload":
            payload = fault.apply(cfg, payload, {"previous": self.previous_hf, "trainer": _MasterView(master)},
                                  **fault.params)
        tcfg = fault.setup(cfg) if fault is not None else cfg
        buckets = pack(payload, tcfg.transport.bucket_bytes)
        if fault is not None and fault.stage == "buckets":
            buckets = fault.apply(cfg, buckets, **fault.params)
        received, report = unpack(buckets, cfg.transport.verify_digests)
        if fault is not None and fault.stage == "engine":
            if fault.name not in ENGINE_FAULTS:
                raise LookupError(f"{fault.name}: not injectable into a running vLLM (needs another engine)")
            repeats = ENGINE_FAULTS[fault.name]
        items = [(r.name, received.tensors[r.name], r.version) for r in received.records if r.name in received.tensors]
        if naive:
            items = ray.get(self.rollout.quantize_online.remote(items))
        t1 = time.perf_counter()
        ray.get(self.rollout.poison.remote())
        res = ray.get(self.rollout.reload.remote(items, self.version, repeats, direct))
        t["install"] = time.perf_counter() - t1
        # digest-first capture: only parameters whose device digest differs from the expected bytes move
        t2 = time.perf_counter()
        expected = expected_engine_state(cfg, trainer_hf)
        got = ray.get(self.rollout.device_digests.remote(SEEDS))
        mismatch = sorted(k for k in got if got[k] != (device_digest(expected[k], SEEDS) if k in expected else None))
        fetched = ray.get(self.rollout.kernel_tensors.remote(mismatch)) if mismatch else {}
        # a mismatching parameter with no bytes (left on the meta device) stays out; metadata names it (S1)
        tensors = {k: fetched[k] if k in mismatch else expected[k] for k in got if k not in mismatch or k in fetched}
        meta = ray.get(self.rollout.metadata.remote())
        meta["errors"] = [] if res["ok"] else [res["error"]]
        meta["version"] = self.version
        if res["ok"] and fault is None and not naive and not direct:
            # idempotence (S7): the same payload installed again must leave every parameter's digest unchanged
            again = ray.get(self.rollout.reload.remote(items, self.version, 1))
            after = ray.get(self.rollout.device_digests.remote(SEEDS))
            meta["resync"] = {"changed": sorted(k for k in got if got[k] != after.get(k))} if again["ok"] \
                else {"error": again["error"]}
        t["capture"] = time.perf_counter() - t2
        rollout_snap = Snapshot("rollout", tensors, meta)
        trainer_snap = Snapshot("trainer", trainer_hf, {"engine": self.trainer_info["engine"], "version": self.version})
        ctx = CheckContext(cfg, payload_snapshot(received, report), trainer_snap, rollout_snap,
                           Snapshot("master", master))
        metrics = None
        if probes:
            t3 = time.perf_counter()
            lt = ray.get(self.trainer.logprobs.remote(PROMPTS))
            lr = ray.get(self.rollout.generate_logprobs.remote(PROMPTS))
            metrics = probe_metrics(lt, lr)
            ctx.probes = metrics
            t["probes"] = time.perf_counter() - t3
        ctx.probe_bounds = self.probe_bounds
        t4 = time.perf_counter()
        findings = run_catalog(ctx, ids=check_ids)
        if probes and self.probe_bounds is None and fault is None and not naive and \
                not {f.invariant_id for f in findings if f.verdict == FAIL and f.invariant_id != "P1"}:
            # the first verified on-policy pass calibrates the probe bounds for this model and engine pair
            self.probe_bounds = calibrated_bounds(metrics)
            findings = [f for f in findings if f.invariant_id != "P1"] + run_catalog(
                _with_bounds(ctx, self.probe_bounds), ids=["P1"])
        t["checks"] = time.perf_counter() - t4
        if fault is None and not naive and not direct:
            self.last_clean = ctx                 # what `write_snapshot` records (the engine holds this sync)
        out = SyncOutcome(label, self.version, findings, len(mismatch), len(got), {k: round(v, 3) for k, v in t.items()},
                          None if res["ok"] else res["error"], metrics)
        out.extra["mismatching_params"] = mismatch[:20]
        out.extra["probe_bounds"] = self.probe_bounds
        return out

    def write_snapshot(self, out: str) -> str:
        """The last clean sync as a snapshot directory that `fp8check verify` checks later, elsewhere: the
        learner's FP8 forward weights, the payload, and every parameter the sampler's kernels read, fetched in
        full from the worker (not the digest-first view). Reading never changes the engine."""
        ctx = self.last_clean
        if ctx is None:
            raise RuntimeError("no clean sync to snapshot yet: take a step and sync first")
        rollout = Snapshot("rollout", self.ray.get(self.rollout.kernel_tensors.remote()), dict(ctx.rollout.meta))
        snaps = {"master": ctx.master, "trainer": ctx.trainer, "payload": ctx.payload, "rollout": rollout}
        write_snapshot_dir(out, snapshot_manifest(self.config, ctx.trainer.meta.get("version"), **snaps), **snaps)
        return f"wrote {out}/ (step {ctx.trainer.meta.get('version')}, {len(rollout.tensors)} engine parameters)"

    def kernel_state(self) -> dict:
        return self.ray.get(self.rollout.kernel_tensors.remote())


class _MasterView:
    """What payload faults may ask of the trainer: its masters in HF names (the live trainer's are CPU copies)."""

    def __init__(self, master: dict):
        self._m = master

    def master_hf(self) -> dict:
        return self._m

    def fp8_forward_weights(self):
        raise LookupError("the live trainer's Megatron-named FP8 tensors are not exposed to payload faults")


# payload / trainer / transport faults injectable into a running engine. The last two may leave vLLM's
# layerwise-reload state needing a repair (a duplicated tensor can leave parameters on the meta device; vLLM
# may refuse to cast fnuz codes), so they run after every other fault.
DESTRUCTIVE = ("tensor_duplicated", "fnuz_codes")
LIVE_FAULTS = ("scale_x2_block", "scale_inv_swap", "square_weight_transposed", "q_k_swapped", "gate_up_swapped",
               "scale_dropped", "bf16_into_fp8_slot", "bucket_lost", "stale_layer_stamped",
               "stale_layer_unstamped", "norm_quantized_in_trainer", "experts_permuted", "rows_shifted_one_block",
               "fp32_scales_rounded_pow2") + DESTRUCTIVE
ENGINE_FAULTS = {"postprocess_skipped": 0, "postprocess_twice": 2}
# every live-injectable fault, in the order a run injects them (the destructive ones last)
ALL_LIVE_FAULTS = tuple(f for f in LIVE_FAULTS if f not in DESTRUCTIVE) + tuple(ENGINE_FAULTS) + DESTRUCTIVE


def run_live(config: SyncConfig, steps: int, workdir: str, faults: list[str] = (), probes: bool = True,
             fp8_source: str = "megatron", session: "LiveSession | None" = None,
             snapshot_dir: str | None = None) -> dict:
    """`fp8check live`: start both engines, take `steps` optimizer steps with a checked sync after each, then
    inject the requested faults (each followed by a clean re-sync that must pass again); `snapshot_dir`: write
    the last clean sync there for `fp8check verify`."""
    from faults import FAULTS
    s = session or LiveSession(config, workdir, fp8_source=fp8_source)
    report = {"config": config.to_dict(), "start_seconds": round(s.start_seconds, 1), "trainer": s.trainer_info,
              "rollout": s.rollout_info, "syncs": [], "faults": []}
    for _ in range(steps):
        s.step()
        report["syncs"].append(s.sync(f"step {s.version}", probes=probes).to_json())
    for name in faults:
        f = FAULTS[name]
        if not f.applies(config):
            report["faults"].append({"fault": name, "verdict": "n/a"})
            continue
        o = s.sync(name, fault=f)
        caught = bool(set(o.fired) & set(f.trips))
        report["faults"].append({"fault": name, "must_trip": list(f.trips), "verdict": "caught" if caught else "missed",
                                 **o.to_json()})
        report["syncs"].append(s.sync(f"clean re-sync after {name}").to_json())
    report["trainer_after"] = s.ray.get(s.trainer.info.remote())
    if snapshot_dir:
        report["snapshot"] = s.write_snapshot(snapshot_dir)
    return report
