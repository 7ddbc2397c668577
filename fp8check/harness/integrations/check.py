"""check_sync: the catalog after a weight sync a user's own RL job performed.

    llm = vllm.LLM(model=..., quantization="fp8", worker_extension_cls=fp8check.WORKER_EXTENSION)
    harness.watch(llm)                        # once, after start-up: lifecycle facts (S7) from then on
    ... the job syncs its weights its own way ...
    findings = harness.check_sync(llm, expected, config)     # raises SyncCheckFailed on a FAIL or an UNKNOWN

`expected` is what the job meant to install: checkpoint-format tensors (a mapping or an iterable of (name, tensor):
`*.weight` E4M3 codes + `*.weight_scale_inv` for FP8 GEMMs, BF16 elsewhere), or the job's Megatron-Core model
(the learner's FP8 forward bytes are read from Transformer Engine's workspaces). The check runs digest-first:
every engine parameter's digest is computed on its GPU and compared with the digest of what it must hold (the
layout map and the engine's declared post-load transform applied to `expected`, where `expected` lives); only
mismatching parameters move to the host. It never changes engine state.

What a post-hoc check cannot see is UNKNOWN, never PASS: per-tensor versions and idempotence (S7) belong to a sync
fp8check carries; post-load counts and storage moves need `watch` before the sync. An UNKNOWN fails the check like
a FAIL unless the caller accepts it (`allow_unknown=True`; the plugin's `--fp8check-allow-unknown`).
"""
from __future__ import annotations

import logging

from ..config import SyncConfig
from ..sync.capture import DigestFirst

log = logging.getLogger("fp8check")

# what a check after someone else's sync can decide (the wire and the lifecycle belong to the sync itself)
STATE_CHECKS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "R1", "R2", "C10")


# where a failure is rooted, upstream first: the configuration (an exclusion split per side), then a wire naming
# the recipe does not use (every "not sent" it explains), then what the user's sync put on the wire, which explains
# the engine's refusal and what the trainer copy (check_sync's `expected` is that wire) and the engine then show
SYNC_RAISED = "the sync function raised"
ROOT_ORDER = ("raised", "config", "naming", "wire", "refused", "trainer", "transport", "engine", "serving")


# inside a stage, a dtype (S5) or exclusion (S6) disagreement comes first: a BF16 tensor sent for an FP8 one is
# why its scale is "not sent" (S1) and its codes "differ" (S2)
ROOT_INVARIANTS = ("S5", "S6")


def root_first(findings) -> list:
    """Failures first, ordered by the stage they are rooted in (the wire the user's sync produced; then the
    engine's refusal of the update, which explains what the engine holds; then the trainer, the transport, the
    engine), S5/S6 first inside a stage, then the other findings in catalog order. A stable sort: catalog order
    is kept among equals."""
    def key(f):
        if f.verdict != "fail":
            return (1, 0, 0)
        stage = f.evidence.get("stage")
        if f.message.startswith("update did not complete"):     # the sync itself raised: nothing explains it
            stage = "raised" if SYNC_RAISED in f.message else "refused"
        return (0, ROOT_ORDER.index(stage) if stage in ROOT_ORDER else len(ROOT_ORDER),
                0 if f.invariant_id in ROOT_INVARIANTS else 1)
    return sorted(findings, key=key)


class SyncCheckFailed(AssertionError):
    """A weight sync violated an invariant, or one could not be decided (UNKNOWN, unless the caller accepts it);
    `findings` holds every finding, root first. The message lists the failures, then what could not be judged."""

    def __init__(self, findings):
        from collections import Counter
        self.findings = root_first(findings)
        bad, seen = [], set()
        for f in self.findings:       # one line per (invariant, tensor), at its root stage
            if f.verdict == "fail" and (f.invariant_id, f.tensor) not in seen:
                seen.add((f.invariant_id, f.tensor))
                bad.append(f)
        unknown = [f for f in self.findings if f.verdict == "unknown"]
        per = Counter(f.invariant_id for f in bad)
        lines = [f"{f.invariant_id} {f.tensor or ''}: {f.message}" for f in bad[:8]]
        lines += [f"{f.invariant_id} {f.tensor or ''}: UNKNOWN {f.message}" for f in unknown[:max(0, 8 - len(bad))]]
        shown = min(len(bad), 8) + min(len(unknown), max(0, 8 - len(bad)))
        more = f" (and {len(bad) + len(unknown) - shown} more)" if len(bad) + len(unknown) > shown else ""
        head = ", ".join(f"{i} x{n}" for i, n in sorted(per.items()))
        what = f"{len(bad)} invariant violation(s) [{head}]" if bad else "no violation"
        if unknown:
            what += f", {len(unknown)} undecided (UNKNOWN: {', '.join(sorted({f.invariant_id for f in unknown}))})"
        super().__init__(f"{what}{more}:\n  " + "\n  ".join(lines))


def failed(findings, allow_unknown: bool = False) -> bool:
    """Does a check over these findings fail: a FAIL, an UNKNOWN (unless accepted), or no finding at all."""
    from fp8check.invariants import overall
    v = overall(findings)
    return v == "fail" or (v == "unknown" and not allow_unknown)


def run_state_checks(ctx, ids=None) -> list:
    """The state checks over a sync someone else performed (the one road's check stage). Default: STATE_CHECKS
    as a selection, those whose condition the config has; `ids` named by the caller run even where it has not."""
    # a selection: R1 on a BF16 KV cache would judge scales no kernel reads (vLLM boots them at a dummy value)
    from ..sync.stages import check
    return check(ctx, ids=list(STATE_CHECKS if ids is None else ids), force=ids is not None).findings


def watch(llm) -> list:
    """Instrument a vLLM engine carrying the worker extension (post-load counters, captured storage). Call once
    after start-up; the wrapped hooks behave exactly as before. Every later `check_sync` judges the post-load
    counts of the syncs since the previous check (or since this call)."""
    layers = llm.collective_rpc("fp8check_instrument")[0]
    llm.collective_rpc("fp8check_counts_since", args=("observe",))      # what came before watch is not a sync
    return layers


def _engine(engine, config: SyncConfig):
    if all(hasattr(engine, m) for m in ("state_digests", "record", "kernel_tensors")):
        return engine                                  # an fp8check engine (protocol) already
    if hasattr(engine, "collective_rpc"):
        from ..engines.vllm import UnsupportedEngine, VLLMEngine, judgeable
        from ..numerics.settings import read_settings
        try:
            raw = engine.collective_rpc("fp8check_settings")[0]
        except AttributeError:
            raw = None                                 # VLLMEngine names the missing extension below
        why = judgeable(read_settings(raw)) if raw is not None else None
        if why:                                        # refused before anything is instrumented or read
            raise UnsupportedEngine(f"check_sync: {why}")
        return VLLMEngine(config, llm=engine, observe_only=True)
    raise TypeError(f"check_sync: {type(engine).__name__} is neither an fp8check engine nor a vLLM engine with "
                    f"collective_rpc (start vllm.LLM with worker_extension_cls=fp8check.WORKER_EXTENSION)")


def _expected(expected, config: SyncConfig) -> tuple[dict, list | None]:
    """(checkpoint-named tensors the engine must hold, the wire as sent or None). A mapping or iterable of
    (name, tensor) is what the job sent, so it is also judged as the wire (S1, S5, S6, S2/S3 at stage `wire`); a
    Megatron-Core model is the learner itself (its FP8 bytes read from TE's workspaces): no wire to judge."""
    if hasattr(expected, "named_modules") and hasattr(expected, "named_parameters"):   # a Megatron-Core model
        from ..engines.te_megatron import megatron_fp8_weights
        dev = next(expected.parameters()).device
        tensors, _ = megatron_fp8_weights(expected, config.layout, device=dev)
        return config.layout.megatron_to_hf(tensors), None
    items = [(str(n), t) for n, t in (expected.items() if hasattr(expected, "items") else expected)]
    return dict(items), items


def check_sync(engine, expected, config: SyncConfig, *, ids=None, on_fail: str = "raise",
               version: int | None = None, allow_unknown: bool = False):
    """Run the catalog on `engine`'s state against `expected`: the one road's capture (digest-first) and check
    stages, observe-only (nothing is poisoned, installed or re-synced). ids: the invariants to run, even where the
    config says their condition is absent (default: STATE_CHECKS, those that apply); an id not in the catalog is
    `UnknownInvariant` (a BadInput) naming it. on_fail: what a failed check does -- raise (SyncCheckFailed) | log |
    return. A check fails on a FAIL and on an UNKNOWN (a check that could not decide is never a pass), unless
    `allow_unknown=True`: then only a FAIL does."""
    from fp8check.invariants import CheckContext, check_ids
    from ..record import ENGINE_RULE, TrainerRecord
    from ..snapshot.model import Snapshot
    from ..sync.stages import capture_state, rollout_snapshot
    from ..sync.timing import Clock
    if on_fail not in ("raise", "log", "return"):
        raise ValueError(f"check_sync: on_fail must be raise, log or return, got {on_fail!r}")
    if ids is not None:
        ids = check_ids(ids)              # before the engine is touched
    from ..sync.payload import payload_from_items
    from ..sync.pipeline import payload_snapshot
    eng = _engine(engine, config)
    trainer_hf, wire = _expected(expected, config)
    online = config.engine_online and wire is not None
    if online:
        # the engine quantizes what it was sent: what it must hold is its own online rule over that
        from ..numerics.online import online_engine_state_hf
        trainer_hf = online_engine_state_hf(config, trainer_hf)
    record, got = capture_state(DigestFirst(), config, eng, trainer_hf, clock=Clock())    # the engine's own word on
    record.version = version                                                            # its poison (`poisoned`)
    payload = None if wire is None else payload_snapshot(payload_from_items(config, wire, version or 0))
    ref = TrainerRecord(ENGINE_RULE if online else "user", version)
    ctx = CheckContext(config, payload, Snapshot("trainer", trainer_hf, ref), rollout_snapshot(got, record))
    findings = root_first(run_state_checks(ctx, ids))
    if failed(findings, allow_unknown):
        if on_fail == "raise":
            raise SyncCheckFailed(findings)
        if on_fail == "log":
            log.error("%s", SyncCheckFailed(findings))
    return findings


__all__ = ["STATE_CHECKS", "SyncCheckFailed", "check_sync", "failed", "root_first", "run_state_checks", "watch"]
