"""Every check proven able to fail, and load-bearing in the matrix: each invariant outside the job rules either
fires *alone* on a fault (removing it from the catalog leaves that fault undetected: nothing else fires), or is
marked in the catalog as a backstop with the fault it fires on beside others (removing it, exactly the others
still fire: its own firing is what the catalog loses, and the fault stays detected by the rest). The ablations
assert on what the remaining invariants fire, never on the verdict alone (which the definition of `caught`
decides once an invariant the fault must trip is removed). The job rules (K, V, N, E, M, X6) are proven the same
way over job configs in test_preflight_rules.py."""
import pytest

from fp8check import faults
from fp8check.faults.matrix import TINY_MODELS, run_cell
from fp8check.harness.config import recommended_config
from fp8check.harness.formats import RECIPES
from fp8check.invariants import REGISTRY

# invariant -> (fault, model, recipe) where it is the only invariant that fires
SOLE = {
    "A1": ("model_exclusions_dropped", "tiny-hybrid", "mxfp8"),
    "A3": ("packing_rule_mismatch", "tiny-dense", "blockwise-fp32"),
    "C1": ("trainer_fp8_workspace_stale", "tiny-dense", "blockwise-fp32"),
    "C3": ("blackwell_with_fp32_scales", "tiny-dense", "blockwise-fp32"),
    "C4": ("fp8_param_with_pow2_scales", "tiny-dense", "blockwise-pow2"),
    "C5": ("mxfp8_on_hopper", "tiny-dense", "blockwise-fp32"),
    "C6": ("trainer_epsilon_latent", "tiny-dense", "blockwise-fp32"),
    "C7": ("engine_block_shape_mismatch", "tiny-dense", "blockwise-fp32"),
    "C8": ("lora_adapter_only_fp8_sync", "tiny-dense", "blockwise-fp32"),
    "C9": ("pow2_scales_fp32_activations", "tiny-dense", "blockwise-pow2"),
    "C10": ("engine_e8m0_unpinned", "tiny-dense", "blockwise-pow2"),
    "X1": ("exclusion_pattern_typo", "tiny-dense", "blockwise-fp32"),
    "P1": ("logprobs_at_sampling_temperature", "tiny-dense", "blockwise-fp32"),
    "R1": ("kv_scale_placeholder", "tiny-dense", "blockwise-fp32"),
    "R2": ("graph_buffer_reallocated", "tiny-dense", "blockwise-fp32"),
    "R3": ("prefix_cache_not_reset", "tiny-dense", "blockwise-fp32"),
    "R4": ("wake_without_resync", "tiny-dense", "blockwise-fp32"),
    "S1": ("tensor_duplicated", "tiny-hybrid", "blockwise-fp32"),
    "S2": ("zero_sign_canonicalized", "tiny-dense", "blockwise-fp32"),
    "S3": ("scale_bit_flip", "tiny-dense", "blockwise-pow2"),
    "S4": ("bytes_corrupted_unverified", "tiny-dense", "blockwise-fp32"),
    "S5": ("hp_tensor_sent_as_fp32", "tiny-dense", "blockwise-fp32"),
    "S6": ("engine_ignored_layers_foreign", "tiny-dense", "blockwise-fp32"),
    "S7": ("postprocess_twice", "tiny-dense", "blockwise-fp32"),
}
BACKSTOPS = sorted(i for i, inv in REGISTRY.items() if inv.backstop)


def test_every_check_is_a_sole_catch_or_a_declared_backstop():
    for i, inv in REGISTRY.items():
        if inv.scope == "job":
            continue
        assert (i in SOLE) != bool(inv.backstop), f"{i}: fires alone on no fault and is not marked a backstop"


@pytest.mark.parametrize("inv", sorted(SOLE))
def test_invariant_fires_alone_and_the_fault_is_lost_without_it(inv):
    fault, model, recipe = SOLE[inv]
    f = faults.FAULTS[fault]
    assert f.trips == (inv,), f"{fault} must name {inv} as its one must-fire invariant"
    cell = run_cell(f, model, recipe)
    assert cell.verdict == "caught" and cell.fired == [inv], (cell.verdict, cell.fired, cell.detail)
    ablated = run_cell(f, model, recipe, without={inv})
    assert ablated.fired == [] and ablated.unknown == cell.unknown, (ablated.fired, ablated.unknown)


def _first_applicable(fault):
    for m in TINY_MODELS:
        for r in RECIPES:
            if fault.applies(recommended_config(m, r)):
                cell = run_cell(fault, m, r)
                if cell.verdict not in ("n/a", "no-target"):
                    return m, r, cell
    raise AssertionError(f"{fault.name} applies nowhere")


@pytest.mark.parametrize("inv", BACKSTOPS)
def test_backstop_fires_on_its_fault_and_is_load_bearing_there(inv):
    f = faults.FAULTS[REGISTRY[inv].backstop]
    assert inv in f.trips
    model, recipe, cell = _first_applicable(f)
    assert cell.verdict == "caught" and inv in cell.fired and len(cell.fired) > 1, (cell.verdict, cell.fired)
    ablated = run_cell(f, model, recipe, without={inv})
    # the others fire as before: the fault is still detected, and what the catalog lost is this invariant's firing
    rest = [i for i in cell.fired if i != inv]
    assert ablated.fired == rest and rest, (ablated.fired, rest)
    assert ablated.unknown == [i for i in cell.unknown if i != inv], (ablated.unknown, cell.unknown)
