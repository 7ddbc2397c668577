"""The checker core: three-valued verdicts, check-safe, the catalog and its coverage by faults."""
import json

import pytest

from fp8check import faults
from fp8check.harness.config import recommended_config
from fp8check.harness.cli import main
from fp8check.harness.snapshot import Snapshot
from fp8check.harness.sync.pipeline import fault_config, reference_sync
from fp8check.invariants import FAIL, PASS, REGISTRY, UNKNOWN, CheckContext, Finding, overall, run_catalog, run_invariant
from fp8check.invariants.base import Invariant


def test_overall_composes_fail_over_unknown_over_pass():
    f = lambda v: Finding("X", v)  # noqa: E731
    assert overall([f(PASS), f(PASS)]) == PASS
    assert overall([f(PASS), f(UNKNOWN)]) == UNKNOWN
    assert overall([f(UNKNOWN), f(FAIL), f(PASS)]) == FAIL


def test_a_raising_check_is_unknown_never_pass():
    def boom(ctx):
        raise RuntimeError("engine not reachable")
    inv = Invariant("T1", "test", "t", "t", boom)
    (f,) = run_invariant(inv, CheckContext(recommended_config("tiny-dense", "blockwise-fp32")))
    assert f.verdict == UNKNOWN and "engine not reachable" in f.message


def test_missing_snapshot_is_unknown():
    out = run_catalog(CheckContext(recommended_config("tiny-dense", "blockwise-fp32")), ids=["S2", "S7"])
    assert {f.verdict for f in out} == {UNKNOWN}


def test_rollout_without_metadata_is_unknown_for_s6_s7():
    from fp8check.harness.record import EngineRecord
    res, _, _ = reference_sync(recommended_config("tiny-dense", "blockwise-fp32"))
    bare = Snapshot("rollout", dict(res.rollout.tensors), EngineRecord("bare"))
    out = run_catalog(CheckContext(res.config, res.payload, res.trainer, bare), ids=["S6", "S7"])
    assert {f.invariant_id for f in out if f.verdict == UNKNOWN} == {"S6", "S7"}


def test_every_sync_invariant_fires_on_two_distinct_faults():
    """Firings, not declarations: each S check actually fails on the cells of at least two different faults."""
    from fp8check.faults.matrix import run_cell
    fired = {i: set() for i in ("S1", "S2", "S3", "S4", "S5", "S6", "S7")}
    for f in faults.FAULTS.values():
        if f.stage == "config" or not set(fired) & set(f.trips):
            continue
        cell = run_cell(f, "tiny-dense", "blockwise-fp32")
        for i in set(cell.fired) & set(fired):
            fired[i].add(f.name)
    for i, names in fired.items():
        assert len(names) >= 2, (i, sorted(names))


def test_at_least_thirty_faults_across_the_taxonomy():
    fams = {f.family for f in faults.FAULTS.values()}
    assert len(faults.FAULTS) >= 30
    assert {"scales", "layouts", "dtypes", "coverage", "exclusion", "postload", "version", "transport"} <= fams
    silent = {f.name for f in faults.FAULTS.values() if f.silent}
    for name in ("square_weight_transposed", "q_k_swapped", "gate_up_swapped", "scale_bit_flip", "scale_x2_block",
                 "fp32_scales_rounded_pow2", "postprocess_twice", "stale_layer_unstamped"):
        assert name in silent


def test_catalog_json(capsys):
    assert main(["catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ids = {r["id"] for r in rows}
    assert {"S1", "S2", "S3", "S4", "S5", "S6", "S7", "C1", "C2", "X1", "A1", "A3", "P1"} <= ids
    s2 = next(r for r in rows if r["id"] == "S2")
    assert "square_weight_transposed" in s2["faults"] and s2["condition"]


def test_registry_ids_are_unique_and_conditions_one_line():
    for inv in REGISTRY.values():
        assert "\n" not in inv.condition and inv.condition


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_checks_never_change_the_reference_engine(model):
    """Running the whole catalog (and the probes) leaves every engine tensor, version and pointer as it was."""
    from fp8check.harness.sync.payload import tensor_digest
    res, trainer, rollout = reference_sync(recommended_config(model, "blockwise-fp32"))
    before = {n: tensor_digest(t) for n, t in rollout.kernel_tensors().items()}
    meta0 = rollout.record()
    ctx = CheckContext(res.config, res.payload, res.trainer, Snapshot("rollout", rollout.kernel_tensors(), res.rollout.meta),
                       Snapshot("master", trainer.master_hf()))
    assert not [f for f in run_catalog(ctx) if f.verdict != PASS]
    after = {n: tensor_digest(t) for n, t in rollout.kernel_tensors().items()}
    meta1 = rollout.record()
    assert before == after and meta1.versions == meta0.versions and meta1.storage_moved == meta0.storage_moved == []


def test_c10_with_nothing_read_is_unknown_and_a_mismatch_fails():
    from fp8check.harness.config import recommended_config
    from fp8check.harness.numerics.settings import config_settings
    from fp8check.harness.record import EngineRecord
    from fp8check.harness.snapshot.model import Snapshot
    from fp8check.invariants import REGISTRY, CheckContext
    from fp8check.invariants.base import run_invariant
    cfg = recommended_config("tiny-dense", "blockwise-fp32")

    def c10(settings):
        rec = EngineRecord("x", 1, [], [], settings=settings)
        return [(f.verdict, f.tensor) for f in run_invariant(REGISTRY["C10"], CheckContext(
            cfg, rollout=Snapshot("rollout", {}, rec)))]
    assert c10({}) == [("unknown", None)]
    assert c10({"method": None, "kv_cache_dtype": None}) == [("unknown", None)]
    assert c10(config_settings(cfg)) == [("pass", None)]
    assert c10({**config_settings(cfg), "kv_cache_dtype": "fp8_e4m3"}) == [("fail", "kv_cache_dtype")]
    assert c10({**config_settings(cfg), "weight_block_size": None}) == [("fail", "weight_block_size")]


def test_a_capped_list_keeps_the_worst_verdict_it_elides():
    """More findings than MAX_FINDINGS end in one summary: a list of UNKNOWNs stays UNKNOWN (nothing was found to
    be wrong), one FAIL among the elided ones makes the summary a FAIL."""
    from fp8check.invariants.base import fail, unknown
    from fp8check.invariants.sync import MAX_FINDINGS, _cap
    unknowns = [unknown("S3", "trainer snapshot lacks this scale", tensor=f"t{i}") for i in range(MAX_FINDINGS + 5)]
    assert _cap("S3", unknowns)[-1].verdict == UNKNOWN and len(_cap("S3", unknowns)) == MAX_FINDINGS + 1
    mixed = unknowns + [fail("S3", "t_last", "scale bits differ")]
    assert _cap("S3", mixed)[-1].verdict == FAIL and "6 more violations" in _cap("S3", mixed)[-1].message
