"""Checks left on for every sync of a run: a schedule's cheap syncs (`run_sync(periodic=False)`) run the catalog
but what costs as much as the sync itself -- S7's re-sync, P1's forwards, C1's requantization -- which the
periodic syncs run; nothing deferred is reported as passed (S7's idempotence part is UNKNOWN, "deferred"), and a
fault the cheap catalog covers is still caught."""
import pytest

from fp8check.e2e.live import LiveSession
from fp8check.faults import FAULTS
from fp8check.harness.config import recommended_config
from fp8check.harness.sync.capture import DigestFirst
from fp8check.harness.sync.pipeline import fault_config, reference_sync
from fp8check.invariants import REGISTRY, run_catalog

CFG = recommended_config("tiny-dense", "blockwise-fp32")


def _ids(res, verdict=None):
    return {f.invariant_id for f in res.findings if verdict is None or f.verdict == verdict}


def test_a_cheap_sync_defers_the_costly_checks_and_says_so():
    res, _, _ = reference_sync(CFG, capture=DigestFirst(), periodic=False, probes=True)
    assert {i for i, inv in REGISTRY.items() if inv.periodic} == {"C1", "P1"}
    assert not {"C1", "P1"} & _ids(res)
    assert res.deferred == ["S7:idempotence", "C1", "P1"]
    assert res.rollout.meta.resync.deferred and res.probes is None
    s7 = [f for f in res.findings if f.invariant_id == "S7"]
    assert [f.verdict for f in s7] == ["pass", "unknown"] and "idempotent" not in s7[0].message
    assert s7[1].message.startswith("deferred: idempotence") and s7[1].evidence["deferred"] is True
    assert not _ids(res, "fail") and _ids(res, "unknown") == {"S7"}
    full, _, _ = reference_sync(CFG, capture=DigestFirst(), probes=True)
    assert {"C1", "P1"} <= _ids(full, "pass") and full.deferred == [] and not full.rollout.meta.resync.deferred
    s7 = [f for f in full.findings if f.invariant_id == "S7"]
    assert "idempotent" in s7[0].message and "not this one" not in s7[0].message


@pytest.mark.parametrize("name", ["scale_x2_block", "q_k_swapped", "bytes_corrupted", "postprocess_twice",
                                  "norm_dropped", "fp32_scales_through_e8m0"])
def test_a_cheap_sync_still_catches_what_its_checks_cover(name):
    fault = FAULTS[name]
    cheap = {i for i in fault.trips if not REGISTRY[i].periodic}
    assert cheap
    res, _, _ = reference_sync(fault_config(CFG, fault), fault=fault, capture=DigestFirst(), periodic=False)
    assert cheap <= _ids(res, "fail")


def test_what_only_a_costly_check_sees_waits_for_a_periodic_sync():
    """The trade a schedule makes, stated: a stale FP8 workspace (C1 alone) is not seen by a cheap sync, and is by
    the periodic one (a stale workspace stays stale: the next periodic sync finds it)."""
    fault = FAULTS["trainer_fp8_workspace_stale"]
    assert set(fault.trips) == {"C1"}
    cfg = fault_config(CFG, fault)
    cheap, _, _ = reference_sync(cfg, fault=fault, capture=DigestFirst(), periodic=False)
    assert "C1" not in _ids(cheap) and "C1" in cheap.deferred
    full, _, _ = reference_sync(cfg, fault=fault, capture=DigestFirst())
    assert "C1" in _ids(full, "fail")


def test_named_periodic_checks_still_run_when_forced():
    res, _, _ = reference_sync(CFG, capture=DigestFirst(), periodic=False, checks=False)
    ctx = res.context()
    assert {f.invariant_id for f in run_catalog(ctx, ids=["C1"], periodic=False)} == {"C1"}
    assert run_catalog(ctx, ids=["C1"], periodic=False, force=False) == []


def test_live_session_runs_the_costly_checks_on_its_schedule():
    with pytest.raises(ValueError):
        LiveSession(CFG, trainer="cpu-reference", rollout="cpu-reference", ray=False, checks_every=0)
    with LiveSession(CFG, trainer="cpu-reference", rollout="cpu-reference", ray=False, checks_every=3) as s:
        periodic = []
        for _ in range(4):
            s.step()
            out = s.sync(probes=True)
            periodic.append("P1" in {f.invariant_id for f in out.findings})
            assert not out.fired and not out.unknown
        assert periodic == [True, False, False, True]
        s.step()
        out = s.sync(fault=FAULTS["scale_x2_block"])          # a fault sync runs everything
        assert "C1" in {f.invariant_id for f in out.findings} and out.extra["deferred"] == []


def test_a_warm_session_pays_its_first_sync_at_start_and_keeps_its_schedule():
    """`LiveSession(warm=True)` (the device path's default) syncs the weights the engines started with, the whole
    catalog, before the caller's first sync; the schedule of costly checks starts with that first sync."""
    with LiveSession(CFG, trainer="cpu-reference", rollout="cpu-reference", ray=False, checks_every=2,
                     warm=True) as s:
        assert s.warmup is not None and not s.warmup.fired and not s.warmup.unknown
        assert "P1" in {f.invariant_id for f in s.warmup.findings} and s.last_clean is None
        periodic = []
        for _ in range(3):
            s.step()
            out = s.sync()
            periodic.append(out.extra["deferred"] == [])
        assert periodic == [True, False, True]
    with LiveSession(CFG, trainer="cpu-reference", rollout="cpu-reference", ray=False) as s:
        assert s.warmup is None                             # off the device path: no warm-up unless asked


def test_a_sync_alone_is_the_baseline_and_leaves_the_schedule():
    """`sync(catalog=False)` (the bench's baseline): the weights installed, nothing poisoned, recorded, captured or
    checked, the schedule of costly checks untouched; a fault sync cannot go unchecked."""
    with LiveSession(CFG, trainer="cpu-reference", rollout="cpu-reference", ray=False, checks_every=2) as s:
        s.step()
        bare = s.sync(catalog=False)
        assert bare.findings == [] and {"export", "wire", "install"} <= set(bare.seconds)
        assert not {"poison", "capture", "checks"} & set(bare.seconds)
        assert not s.rollout.record().poisoned and s.rollout.record().last_update.version == bare.version
        out = s.sync()                                       # the schedule's first sync: periodic
        assert out.extra["deferred"] == [] and not out.fired and not out.unknown
        with pytest.raises(ValueError):
            s.sync(fault=FAULTS["scale_x2_block"], catalog=False)
