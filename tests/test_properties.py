"""Hypothesis properties over generated models, recipes, TP sizes and fault parameters:
clean sync -> no finding (1000 examples in CI, in four deterministic shards); fault -> every invariant it declares
must fire fires (the matrix's rule). A draw where the fault does not apply, or its injector finds no target, is
rejected (`assume`), never counted as a pass."""
import os

import pytest
from hypothesis import assume, given, seed, settings, strategies as st

from fp8check import faults
from fp8check.faults import NoTarget
from fp8check.harness import strategies as fst
from fp8check.harness.sync.pipeline import fault_config, reference_sync
from fp8check.invariants import run_catalog

FAMILIES = ("sync", "contract", "exclusion", "alignment")
CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"


def _findings(config, fault=None):
    res, _, _ = reference_sync(fault_config(config, fault), fault=fault, checks=False)
    return run_catalog(res.context(), families=FAMILIES)


def _clean(config):
    bad = [(f.invariant_id, f.tensor, f.message[:90]) for f in _findings(config) if f.verdict != "pass"]
    assert not bad, (config.model, config.recipe.name, config.rollout.tp_size, bad[:4])


def _shard(k):
    @settings(max_examples=250)
    @given(fst.sync_configs())
    def prop(config):
        _clean(config)
    return seed(1000 + k)(prop) if CI else prop


test_clean_sync_never_alarms_0 = _shard(0)
test_clean_sync_never_alarms_1 = _shard(1)
test_clean_sync_never_alarms_2 = _shard(2)
test_clean_sync_never_alarms_3 = _shard(3)

PARAM_FAULTS = ["scale_bit_flip", "scale_x2_block", "scale_inv_swap", "rows_shifted_one_block", "scale_dropped",
                "tensor_duplicated", "bf16_into_fp8_slot", "square_weight_transposed", "gate_up_swapped"]


@settings(max_examples=150)
@given(config=fst.sync_configs(), name=st.sampled_from(PARAM_FAULTS), params=fst.fault_params())
def test_fault_trips_its_invariant(config, name, params):
    f = faults.FAULTS[name]
    accepted = {"scale_bit_flip": ("index", "element", "bit"), "scale_x2_block": ("index", "element")}.get(
        name, ("index",) if name not in ("scale_dropped",) else ("index",))
    f = f.with_params(**{k: v for k, v in params.items() if k in accepted})
    assume(f.applies(config))
    try:
        fired = {x.invariant_id for x in _findings(config, f) if x.verdict == "fail"}
    except NoTarget:
        assume(False)                                   # no target for this fault in this generated model
    assert set(f.trips) <= fired, (name, f.params, sorted(fired), f.trips)


@pytest.mark.parametrize("bit", range(32))
def test_every_scale_bit_flip_is_caught(bit):
    """Exhaustive over the bit position of a flipped FP32 scale, both sign and exponent and mantissa bits."""
    from fp8check.harness.config import recommended_config
    f = faults.FAULTS["scale_bit_flip"].with_params(bit=bit, element=5)
    fired = {x.invariant_id for x in _findings(recommended_config("tiny-dense", "blockwise-fp32"), f)
             if x.verdict == "fail"}
    assert "S3" in fired
