"""One road on real vLLM (tests/test_one_road.py's claim, live): a fault reaches the same checks through every
driver -- `run_sync` (fp8check's own sync), the pytest plugin's `SyncChecker` (a user's function doing the same
corruption through the same interceptors) and `check_sync` (observe-only, after one faulty install) -- and the
verdicts are those of the CPU mirror. The learner is the CPU reference (its bytes are Transformer Engine's); the
engine is one vLLM 0.26 engine behind the remote wrapper, poisoned before every sync, so no driver sees another's
weights."""
import pytest

from fp8check.faults import FAULTS
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import STATE_CHECKS, check_sync
from fp8check.harness.sync.pipeline import fault_config, interceptors, reference_sync, run_sync
from one_road import plugin_findings

from .conftest import record

pytestmark = pytest.mark.gpu

BASE = recommended_config("tiny-dense", "blockwise-fp32")
# the stages a user's own sync can carry (the engine- and serving-stage faults need fp8check's engine knobs)
CASES = [None, "norm_quantized_in_trainer", "scale_dropped", "q_k_swapped", "bytes_corrupted"]


def _fired(findings, drop=()) -> list:
    return sorted({f.invariant_id for f in findings
                   if f.verdict == "fail" and f.invariant_id in STATE_CHECKS and f.invariant_id not in drop})


@pytest.mark.parametrize("name", CASES, ids=[n or "clean" for n in CASES])
def test_live_a_fault_reaches_the_same_checks_through_every_driver(engine, name):
    fault = FAULTS[name] if name else None
    cfg = fault_config(BASE, fault)
    rollout = engine(cfg)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()

    own = run_sync(cfg, trainer, rollout, fault=fault).findings
    plugin = plugin_findings(cfg, trainer, rollout, interceptors(fault))
    res = run_sync(cfg, trainer, rollout, fault=fault, checks=False, resync=False)
    observed = check_sync(rollout, res.trainer.tensors, cfg, on_fail="return", version=res.version)

    mirror, _, _ = reference_sync(cfg, fault=fault)
    record("live_one_road", fault=name, own=_fired(own), plugin=_fired(plugin), check_sync=_fired(observed),
           mirror=_fired(mirror.findings))
    assert _fired(own) == _fired(mirror.findings), (name, _fired(own), _fired(mirror.findings))
    assert _fired(plugin) == _fired(own), (name, _fired(own), _fired(plugin))
    assert _fired(observed, drop=("S7",)) == _fired(own, drop=("S7",)), (name, _fired(own), _fired(observed))
    if fault is not None:
        assert set(fault.trips) & set(STATE_CHECKS) <= set(_fired(own)), (name, fault.trips, _fired(own))
    else:
        assert _fired(own) == [] and not [f for f in observed if f.verdict == "fail"]
