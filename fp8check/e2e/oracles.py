"""Two oracles after one sync: fp8check's catalog beside vLLM's own weight checker (vLLM 0.32+).

vLLM's checker proves a round trip: checksum the engine's parameters, `reset` them (zeroed), run the same sync
again, `compare` against the first checksum (harness.engines.vllm_checksum). It holds the engine to itself, so it
passes whatever the sender got wrong the same way twice, and it never reads a buffer (the KV-cache scales). fp8check
judges the engine against the trainer's tensors and the declared serving state. `round_trip` runs both on one
fault; on the CPU the engine is fp8check's mirror of vLLM (harness.engines.cpu) and the checksums are fp8check's
mirror of vLLM's algorithm: a demonstration of what each oracle can see, not vLLM running. On a live vLLM 0.32+
engine the same protocol runs through the engine's own `compute_weight_checksums` / `reset_weights`
(`VLLMEngine.weight_checksums`, `.reset_weights`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fp8check.faults import FAULTS
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.vllm_checksum import compare_checksums
from fp8check.harness.sync.pipeline import fault_config, reference_sync, run_sync
from fp8check.invariants import REGISTRY, Verdict


@dataclass
class OracleRow:
    """One sync judged twice. `vllm`: vLLM's compare after the round trip (`match`, `mismatches`); `fired`: the
    invariants fp8check failed on the sync; `verdict`: fp8check's, composed fail > unknown > pass."""
    fault: str | None
    vllm_match: bool
    vllm_mismatches: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    verdict: str = Verdict.UNKNOWN
    findings: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"fault": self.fault or "clean", "vllm_weight_checker": "match" if self.vllm_match else "mismatch",
                "vllm_mismatches": self.vllm_mismatches[:8], "fp8check": str(self.verdict), "fired": self.fired}


def _round_trip(rollout, resync) -> dict:
    baseline = rollout.weight_checksums()
    rollout.reset_weights()
    resync()
    return compare_checksums(rollout.weight_checksums(), baseline)


def round_trip(fault: str | None = None, model: str = "tiny-dense", recipe: str = "blockwise-fp32",
               check_ids=None) -> OracleRow:
    """One sync of `model` under `fault` on the CPU reference engines, judged by fp8check's catalog (the sync
    family and R1 unless `check_ids`), then vLLM's round trip on the same engine: checksum, reset, the same sync
    (the same trainer step, the same fault) again, compare."""
    f = FAULTS[fault] if fault is not None else None
    config = fault_config(recommended_config(model, recipe), f)
    ids = list(check_ids) if check_ids is not None else \
        [i for i, inv in REGISTRY.items() if inv.family == "sync" or i == "R1"]
    res, trainer, rollout = reference_sync(config, fault=f, check_ids=ids, probes=False)
    previous = (lambda: trainer.export_hf_at(trainer.step - 1))
    cmp = _round_trip(rollout, lambda: run_sync(config, trainer, rollout, fault=f, previous=previous, poison=False,
                                                resync=False, checks=False, master=False))
    findings = res.findings or []
    fired = sorted({x.invariant_id for x in findings if x.verdict == Verdict.FAIL})
    verdict = Verdict.FAIL if fired else (Verdict.UNKNOWN if not findings or any(
        x.verdict == Verdict.UNKNOWN for x in findings) else Verdict.PASS)
    return OracleRow(fault, cmp["match"], cmp["mismatches"], fired, verdict,
                     [x for x in findings if x.verdict != Verdict.PASS])


# the rows of docs/vllm-versions.md's comparison table: each shows what one oracle sees and the other does not
TABLE_FAULTS = (None, "kv_scale_placeholder", "stale_layer_unstamped", "norm_dropped")


__all__ = ["OracleRow", "TABLE_FAULTS", "round_trip"]
