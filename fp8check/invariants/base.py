"""Checker core: an invariant is an id, a one-line condition and a pure check over a CheckContext.

A check returns Findings (plain data). Validity has three values and composes fail > unknown > pass; a check
that raises, or lacks what it needs, reports unknown with the reason, never pass (Jepsen's `check-safe`).
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable

from fp8check.harness.config import SyncConfig
from fp8check.harness.layouts import is_scale_name, rank_name, scale_name, weight_of_scale
from fp8check.harness.memo import IdentityMemo
from fp8check.harness.snapshot import Snapshot

if TYPE_CHECKING:                   # annotations only: the job config loads where a job rule runs
    from fp8check.harness.jobconfig import Job


class Verdict(StrEnum):
    """A finding's validity. A StrEnum: it compares, formats and serialises as its value ("pass", ...)."""
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


PASS, FAIL, UNKNOWN = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN
# the trainer's dequantized FP8 weights by the identity (and version) of its codes and scales; a few tiny models'
# worth: at real shapes it holds a few tensors
TRAINER_VALUES = IdentityMemo(128 << 20)
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}


@dataclass(frozen=True)
class Finding:
    invariant_id: str
    verdict: str
    tensor: str | None = None
    message: str = ""
    evidence: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        return {"invariant_id": self.invariant_id, "verdict": self.verdict, "tensor": self.tensor,
                "message": self.message, "evidence": self.evidence}


@dataclass
class CheckContext:
    """Everything a check may read. Snapshots may be None (a check that needs one reports unknown)."""
    config: SyncConfig
    payload: Snapshot | None = None      # received wire: tensors + meta {records, receive}
    trainer: Snapshot | None = None      # learner's FP8 forward weights, HF names
    rollout: Snapshot | None = None      # what the sampler's kernels read, vLLM names (+ meta)
    master: Snapshot | None = None       # trainer high-precision masters, HF names
    # the engines' log-probs on the probe prompts. Named, not imported: invariants.probes imports this module, and
    # an import back (even under TYPE_CHECKING) is a cycle tests/test_architecture.py refuses
    probes: "fp8check.invariants.probes.ProbeRun | None" = None
    probe_bounds: dict | None = None     # P1 bounds fixed before the run (default: derived per sync, see P1)
    job: Job | None = None               # a parsed RL job config: the job rules read it
    cold: Snapshot | None = None         # a fresh engine given the same sync (the cold-vs-warm differential)
    # pure functions of the trainer's tensors the pipeline computed ahead for this sync, during the install
    # (a check takes a result only for the very tensors it was computed from; named, not imported, as `probes`)
    screens: "fp8check.invariants.screens.TrainerScreens | None" = None
    # the payload's receive report and record digests hold for its bytes (made by this process's receiver, or
    # verified against them when a snapshot was read): a matching digest may stand for the wire's bytes
    # (`wire_verified`). False: the wire is judged by its bytes, as the engine state is
    wire_digests: bool = True

    def trainer_value(self, name: str):
        """One trainer tensor as fp32 values (FP8 dequantized), computed on demand; None if absent. Dequantized
        FP8 weights are kept (several checks read them); high-precision ones are cast again on each call (at
        real shapes an fp32 copy of the vocabulary embeddings is 2.5 GB)."""
        cache = self.__dict__.setdefault("_trainer_value", {})
        if name in cache:
            return cache[name]
        cfg, sn = self.config, scale_name(name)
        t, s = self.trainer.get(name), self.trainer.get(sn)
        fp8 = name in cfg.fp8_tensors and s is not None
        try:
            if t is None:
                v = None
            elif fp8:                  # the export's tensors are shared from sync to sync: dequantized once
                v = TRAINER_VALUES.get_for(("dequantize", cfg.trainer_recipe), (t, s),
                                           lambda: cfg.trainer_recipe.dequantize_weight(t, s))
            else:
                v = t.float()
        except (ValueError, RuntimeError, IndexError, TypeError):
            v = None
        if fp8 or v is None:
            cache[name] = v
        return v

    @property
    def trainer_values(self) -> dict:
        """Every trainer tensor as fp32 values, HF names."""
        vals = {t.name: self.trainer_value(t.name) for t in self.config.spec.tensors()}
        return {n: v for n, v in vals.items() if v is not None}

    def expected_kernel(self, name: str):
        """The trainer's codes and scale of FP8 weight `name` after the engine's *declared* post-load transform
        (EngineRecord.post_load: e.g. vLLM's UE8M0 requantization; identity otherwise), in checkpoint
        coordinates, plus whether a transform applied. The transforms are block-local, so applying one per
        checkpoint tensor equals applying it per fused engine parameter. None when the trainer's tensors cannot
        be transformed (wrong shape: see S4)."""
        cache = self.__dict__.setdefault("_expected_kernel", {})
        if name not in cache:
            codes, scale = self.trainer[name], self.trainer[scale_name(name)]
            decl = self.rollout.meta.post_load if self.rollout is not None and self.rollout.meta is not None else None
            # the common case, no transform declared, before the parameter lookup (~1500 experts a check)
            param = _declared_param(self.config, name) if decl is not None and decl.params else None
            if param is None or param not in decl.params:
                cache[name] = (codes, scale, False)
            else:
                from fp8check.harness.numerics import apply_post_load
                # by identity and version, CPU only (on a GPU an extension may rewrite a tensor without moving its
                # version)
                key = (id(codes), codes._version, id(scale), scale._version, param, decl.kind)
                hit = _TRANSFORMED.get(key) if codes.device.type == "cpu" else None
                if hit is None or hit[0] is not codes or hit[1] is not scale:
                    try:
                        q, sc, _ = apply_post_load(decl, param, codes, scale)
                    except (ValueError, RuntimeError, IndexError):
                        q = sc = None
                    hit = (codes, scale, q, sc)
                    if codes.device.type == "cpu":            # a GPU result is not kept (nor its memory)
                        _TRANSFORMED[key] = hit
                        if len(_TRANSFORMED) > 4096:
                            _TRANSFORMED.pop(next(iter(_TRANSFORMED)))
                cache[name] = None if hit[2] is None else (hit[2], hit[3], True)
        return cache[name]

    def expected_hf(self, name: str):
        """What a correct sync leaves in the engine, in checkpoint coordinates: the trainer's tensor, an FP8 weight
        or scale through the engine's declared post-load transform (`expected_kernel`), a high-precision one as the
        BF16 the engine holds; None where the trainer cannot give it. The same bytes as
        `expected_engine_state` mapped back through the layout, without building a fused parameter."""
        fp8 = self.config.layout.engine_fp8_hf
        weight = weight_of_scale(name) if is_scale_name(name) else name
        if weight in fp8:
            if weight not in self.trainer or scale_name(weight) not in self.trainer:
                return None
            ek = self.expected_kernel(weight)
            return None if ek is None else ek[1 if weight != name else 0]
        t = self.trainer.get(name)
        return None if t is None else t.to(torch_bf16())

    @cached_property
    def proven_hf(self) -> frozenset:
        """Checkpoint tensors every engine parameter of which (every rank; codes and scale) the capture's digests
        proved (`Snapshot.proof`): the engine holds exactly `expected_hf` of them."""
        proof = self.rollout.proof if self.rollout is not None else None
        if proof is None or not proof.matched:
            return frozenset()
        matched = set(proof.matched)
        return frozenset(n for n, dsts in self.config.layout.rollout_destinations().items() if dsts <= matched)

    @cached_property
    def wire_verified(self) -> frozenset:
        """Wire tensors the sync's own digests show equal to the trainer's, without reading them: the receiver
        found the bytes it got to have the manifest's digest (not in `digest_mismatch`), and the manifest's digest
        is the digest of the trainer's tensor (the sender's, memoized by identity: free where the wire carries the
        trainer's own tensor). A comparison of those in a check would read both sides for the same answer."""
        from collections import Counter
        from fp8check.harness.sync.payload import sender_digests
        meta = self.payload.meta if self.payload is not None else None
        rcv = getattr(meta, "receive", None)
        if rcv is None or self.trainer is None or not self.wire_digests:
            return frozenset()
        counts = Counter(r.name for r in meta.records)
        bad = set(rcv.digest_mismatch)
        recs = [r for r in meta.records if counts[r.name] == 1 and r.name not in bad and r.name in self.payload
                and r.name in self.trainer]
        digests = sender_digests([self.trainer[r.name] for r in recs])
        return frozenset(r.name for r, d in zip(recs, digests) if d == r.digest)

    @cached_property
    def rollout_hf(self) -> dict:
        """Rollout tensors mapped back to checkpoint coordinates (fusion and TP narrowing undone). A source
        whose pieces are missing or misshapen in the rollout is left out and explained in `rollout_hf_errors`.
        A source the capture's digests proved is the trainer's own tensor (through the declared transform): the
        same bytes, and a comparison with the trainer's that reads nothing (`harness.bitview`: one view)."""
        errors: dict[str, str] = {}
        proven = {}
        for n in self.proven_hf:
            v = self.expected_hf(n)
            if v is not None:
                proven[n] = v
        out = self.config.layout.vllm_to_hf(self.rollout, errors=errors, skip=frozenset(proven))
        out.update(proven)
        self.rollout_hf_errors = errors
        return out


def torch_bf16():
    import torch
    return torch.bfloat16


def _declared_param(cfg: SyncConfig, name: str) -> str:
    """The rank-0 engine parameter an HF FP8 weight lands in (how the engine's declaration names it)."""
    first = cfg.layout.__dict__.get("_first_destination")
    if first is None:                   # one pass over the pieces per map, not one per weight (3000 experts)
        first = {}
        for p in cfg.layout.vllm[0]:
            first.setdefault(p.src, p.dst)
        cfg.layout.__dict__["_first_destination"] = first
    return rank_name(first[name], 0, cfg.rollout.tp_size)


# memo of the declared transform by tensor identity (the entry keeps its inputs alive, so ids stay unique)
_TRANSFORMED: dict = {}


@dataclass(frozen=True)
class Invariant:
    id: str
    family: str
    title: str
    condition: str
    check: Callable[[CheckContext], Iterable[Finding]]
    needs: tuple[str, ...] = ()         # context members it reads beyond the config (snapshots, "job", ...)
    live: bool = True                   # meaningful against live engines (else config / CPU only)
    source: str = ""                    # where the rule comes from (a stack's file it mirrors, a field report)
    why: str = ""                       # why it exists and what to change (`fp8check preflight --explain`)
    severity: str = "error"             # error | warning: how pre-flight reports a failing job rule
    applies: Callable | None = None     # config -> bool: the condition exists in this configuration at all
    backstop: str = ""                  # never the only check that fires: the fault where it fires beside others
    # costs what the sync costs (a reference forward, a requantization of every master): run on the syncs a
    # caller's schedule marks periodic (`run_catalog(periodic=False)` leaves it out, `LiveSession(checks_every=)`)
    periodic: bool = False
    stacks: tuple[str, ...] = ()        # a job rule over these stacks' keys only (Job.stack); () any stack

    @property
    def scope(self) -> str:
        """sync: judges snapshots of a sync; config: the SyncConfig alone; job: an RL job's own keys;
        differential: a warm engine against a cold one given the same weights."""
        if "job" in self.needs:
            return "job"
        if "cold" in self.needs:
            return "differential"
        return "sync" if self.needs else "config"


REGISTRY: dict[str, Invariant] = {}


def invariant(id: str, family: str, title: str, condition: str, needs: tuple[str, ...] = (), live: bool = True,
              source: str = "", why: str = "", severity: str = "error", applies: Callable | None = None,
              backstop: str = "", periodic: bool = False, stacks: tuple[str, ...] = ()):
    def deco(fn):
        if id in REGISTRY:
            raise ValueError(f"invariant id {id} registered twice")
        if severity not in ("error", "warning"):
            raise ValueError(f"invariant {id}: severity must be error or warning")
        REGISTRY[id] = Invariant(id, family, title, condition, fn, needs, live, source, why, severity, applies,
                                 backstop, periodic, tuple(stacks))
        return fn
    return deco


def fail(inv_id: str, tensor: str | None, message: str, **evidence) -> Finding:
    return Finding(inv_id, FAIL, tensor, message, evidence)


def unknown(inv_id: str, message: str, tensor: str | None = None, **evidence) -> Finding:
    return Finding(inv_id, UNKNOWN, tensor, message, evidence)


def passed(inv_id: str, message: str = "", **evidence) -> Finding:
    return Finding(inv_id, PASS, None, message, evidence)


def run_invariant(inv: Invariant, ctx: CheckContext) -> list[Finding]:
    missing = [n for n in inv.needs if getattr(ctx, n, None) is None]
    if missing:
        return [unknown(inv.id, f"cannot run: no {', '.join(missing)} snapshot")]
    try:
        out = list(inv.check(ctx))
    except Exception as e:  # noqa: BLE001 - check-safe: an exception is unknown, never pass
        tb = traceback.format_exc().strip().splitlines()
        return [unknown(inv.id, f"check raised {e.__class__.__name__}: {e}", where=tb[-3:] if tb else [])]
    if not out:
        out = [passed(inv.id)]
    return out


def _other_stack(inv: Invariant, ctx: CheckContext) -> bool:
    return bool(inv.stacks) and ctx.job is not None and ctx.job.stack not in inv.stacks


def not_applicable(inv: Invariant, ctx: CheckContext) -> str | None:
    """Why `inv` has nothing to judge in `ctx`, or None: a job rule over another stack's keys, or a condition the
    configuration does not have (`applies`: R1 without an FP8 KV cache). Reported as not applicable, with this
    reason, never as a rule that holds."""
    if _other_stack(inv, ctx):
        return f"a rule over {' / '.join(inv.stacks)} keys; this job's keys are {ctx.job.stack}'s"
    if inv.applies is not None and not inv.applies(ctx.config):
        return "its condition does not exist in this configuration"
    return None


def run_catalog(ctx: CheckContext, ids: Iterable[str] | None = None, families: Iterable[str] | None = None,
                static_only: bool = False, force: bool = True, timings: dict | None = None,
                periodic: bool = True, skipped: dict | None = None) -> list[Finding]:
    """Run the selected invariants. `static_only`: only the rules over the config and the job (no snapshots).
    `timings`: filled with each invariant's seconds (where a catalog's time goes). Job rules run when the context
    carries a job (preflight); elsewhere there is no job config to judge.
    `ids`: every one must be in the catalog (else `UnknownInvariant`, naming it and the nearest ids).
    `force`: ids named in `ids` run even where their condition does not exist in this configuration (a user asked
    for them); False makes `ids` a selection only (a caller's default set). A job rule over another stack's keys
    never runs.
    `periodic=False`: this sync is not one of a schedule's periodic ones: the invariants that cost what a sync
    costs (`Invariant.periodic`) are left out, unless named in `ids` with `force`.
    `skipped`: filled with id -> why for the selected invariants not run as not applicable (`not_applicable`)."""
    ids = check_ids(ids) if ids is not None else None
    fams = set(families) if families is not None else None
    out = []
    for inv in REGISTRY.values():
        if static_only and inv.scope in ("sync", "differential"):
            continue
        if ids is not None and inv.id not in ids:
            continue
        if fams is not None and inv.family not in fams:
            continue
        explicit = force and ids is not None and inv.id in ids
        if inv.scope == "job" and ctx.job is None and not explicit:
            continue
        if inv.scope == "differential" and ctx.cold is None and not explicit:
            continue
        why = not_applicable(inv, ctx)
        if why is not None and (not explicit or _other_stack(inv, ctx)):
            if skipped is not None:
                skipped[inv.id] = why
            continue
        if inv.periodic and not periodic and not explicit:
            continue
        t0 = time.perf_counter()
        out += run_invariant(inv, ctx)
        if timings is not None:
            timings[inv.id] = timings.get(inv.id, 0.0) + time.perf_counter() - t0
    return out


def overall(findings: Iterable[Finding]) -> str:
    """fail > unknown > pass over the findings; no finding at all is UNKNOWN (nothing was checked)."""
    v = None
    for f in findings:
        if v is None or _RANK[f.verdict] > _RANK[v]:
            v = f.verdict
    return UNKNOWN if v is None else v


def check_ids(ids: Iterable[str]) -> list[str]:
    """`ids` as a list, each in the catalog; else `UnknownInvariant` naming the first unknown id and the nearest
    known ones (an id dropped silently is a check that never ran)."""
    import difflib
    from fp8check.harness.errors import UnknownInvariant
    ids = [ids] if isinstance(ids, str) else list(ids)
    for i in ids:
        if i not in REGISTRY:
            upper = str(i).strip().upper()
            near = ([upper] if upper in REGISTRY else []) + [
                n for n in difflib.get_close_matches(upper, list(REGISTRY), n=3, cutoff=0.5) if n != upper]
            raise UnknownInvariant(f"unknown invariant id {i!r}: not in the catalog"
                                   + (f"; nearest: {', '.join(near[:3])}" if near else "")
                                   + " (`fp8check catalog` lists them)")
    return ids


def by_invariant(findings: Iterable[Finding]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in findings:
        out[f.invariant_id] = f.verdict if _RANK[f.verdict] > _RANK.get(out.get(f.invariant_id, PASS), 0) \
            else out.get(f.invariant_id, PASS)
    return out


def fired(findings: Iterable[Finding]) -> set[str]:
    return {f.invariant_id for f in findings if f.verdict == FAIL}
