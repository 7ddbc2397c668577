"""The fault-injection matrix as tests: on every tiny model and recipe, every applicable fault is caught by all of
the invariants it declares must fire, and nothing fires that it does not declare (must or may); every clean run
passes every invariant (no false alarm). Where each fault injects is pinned: a fault that silently stops applying
(an `applies` that narrows, an injector that starts finding no target) fails here."""
import pytest

from fp8check import faults
from fp8check.faults.matrix import TINY_MODELS, matrix_cells, run_cell
from fp8check.harness.config import recommended_config
from fp8check.harness.formats import RECIPES

# cells whose fault cannot apply to that model / recipe (its `applies`) are not tests at all (the CLI lists them n/a)
CELLS = [(f, m, r) for f, m, r in matrix_cells() if f is None or faults.FAULTS[f].applies(recommended_config(m, r))]

# Of the 9 cells (tiny model x recipe), how many each fault corrupts something in. Generated once from the matrix
# and checked by hand against each fault's `applies` (block-only faults: 6, the mxfp8 cells out; FP32-scale or
# pow2-scale faults: 3; MoE-only faults: tiny-moe's 3, its 2 block recipes where a 128-row block must fit; faults
# on gated delta-net layers: tiny-hybrid's 3; q_k_swapped: q and k of one shape, tiny-dense alone;
# te_padded_scale_on_wire: a K not a multiple of 4 blocks, tiny-moe's) and `NO_TARGET` below.
APPLICABLE = {
    "bf16_into_fp8_slot": 9, "bucket_lost": 9, "bucket_truncated": 9, "buckets_reordered": 9, "bytes_corrupted": 9,
    "bytes_corrupted_unverified": 9, "engine_ignored_layers_foreign": 9, "exclusion_pattern_typo": 9,
    "exclusion_splits_fused_gemm": 9, "fnuz_codes": 9, "fused_shards_clobbered": 9, "gate_up_swapped": 9,
    "generation_during_sync": 9, "graph_buffer_reallocated": 9, "hp_tensor_sent_as_fp32": 9,
    "k_scale_zeroed_by_pause": 9, "kv_scale_placeholder": 9, "kv_scales_not_synced": 9,
    "kv_scales_zeroed_by_level2_sleep": 9, "linear_bf16_in_engine_only": 9, "logprobs_at_sampling_temperature": 9,
    "lora_adapter_only_fp8_sync": 9, "norm_dropped": 9, "norm_quantized_in_trainer": 9, "packed_scales_copied_raw": 9,
    "packing_rule_mismatch": 9, "postprocess_skipped": 9, "postprocess_twice": 9, "pp_scales_remapped_twice": 9,
    "prefix_cache_not_reset": 9, "quantize_failure_sends_bf16": 9, "scale_bit_flip": 9, "scale_dropped": 9,
    "scale_inv_swap": 9, "scale_nan_block": 9, "scale_x2_block": 9, "square_weight_transposed": 9,
    "stale_layer_stamped": 9, "stale_layer_unstamped": 9, "tensor_duplicated": 9, "trainer_fp8_workspace_stale": 9,
    "unknown_name": 9, "wake_resets_kv_scales": 9, "wake_without_resync": 9, "write_into_detached_copy": 9,
    "zero_sign_canonicalized": 9,
    "activation_grid_for_weight": 6, "e5m2_codes": 6, "engine_block_shape_mismatch": 6, "engine_e8m0_unpinned": 6,
    "exclusion_unanchored_regex": 6, "model_exclusions_dropped": 6, "mxfp8_on_hopper": 6, "rows_shifted_one_block": 6,
    "sender_epsilon_mismatch": 6, "tp_breaks_block_divisibility": 6, "tp_shards_swapped": 6,
    "trainer_cp_packing_mismatch": 6, "trainer_epsilon_latent": 6, "trainer_epsilon_mismatch": 6,
    "megatron_qkv_not_deinterleaved": 6,
    "scale_grid_transposed": 5,
    "blackwell_with_fp32_scales": 3, "exclusion_substring_match": 3, "experts_permuted": 3,
    "fp32_scale_sent_as_bf16": 3, "fp32_scales_rounded_pow2": 3, "fp32_scales_through_e8m0": 3,
    "fp8_param_with_mxfp8": 3, "gdn_a_log_dt_bias_swapped": 3, "gdn_in_proj_misordered": 3, "fp8_param_with_pow2_scales": 3, "pow2_scales_fp32_activations": 3, "q_k_swapped": 3,
    "router_quantized_in_engine": 3, "shared_expert_gate_quantized": 3, "trainer_pow2_scales": 3,
    "router_exclusion_dropped": 2, "shared_expert_shard_below_block": 2, "te_padded_scale_on_wire": 2,
}
# cells where the fault applies and its injector says it found nothing to corrupt (NoTarget), with why: tiny-dense's
# power-of-two q_proj scale grid is symmetric, so its transpose is the same bytes
NO_TARGET = {("scale_grid_transposed", "tiny-dense", "blockwise-pow2"): "symmetric scale grid"}


def test_where_each_fault_applies_is_pinned():
    assert set(APPLICABLE) == set(faults.FAULTS), "pin the new fault's applicable-cell count here"
    grid = [recommended_config(m, r) for m in TINY_MODELS for r in RECIPES]
    got = {name: sum(f.applies(c) for c in grid) - sum(k[0] == name for k in NO_TARGET)
           for name, f in faults.FAULTS.items()}
    assert got == APPLICABLE


@pytest.mark.parametrize("fault,model,recipe", CELLS, ids=[f"{f or 'clean'}-{m}-{r}" for f, m, r in CELLS])
def test_cell(fault, model, recipe):
    cell = run_cell(faults.FAULTS[fault] if fault else None, model, recipe)
    pinned = NO_TARGET.get((fault, model, recipe))
    if pinned is not None or cell.verdict == "no-target":
        assert cell.verdict == "no-target" and pinned is not None and pinned in cell.detail, \
            (cell.verdict, cell.detail, pinned)
        return
    detail = [(f.invariant_id, f.tensor, f.message[:100]) for f in cell.findings[:5]]
    if fault is None:
        assert cell.verdict == "pass", f"false alarm: fired {cell.fired}, unknown {cell.unknown}: {detail}"
    else:
        assert cell.verdict == "caught", (f"{fault}: must fire {cell.expected}, fired {cell.fired} "
                                          f"{cell.detail}: {detail}")
        assert not cell.undeclared, f"{fault}: {cell.undeclared} fired but are declared neither must nor may"


def test_an_injector_that_raises_is_an_error_never_a_skipped_cell():
    """A KeyError (a LookupError) in an injector is a bug in it: the cell is an error that fails the matrix, not a
    fault with no target."""
    from dataclasses import replace
    f = faults.FAULTS["fnuz_codes"]
    broken = replace(f, apply=lambda c, p, ctx, index=0: p.tensors["model.layers.0.no_such_proj.weight"])
    cell = run_cell(broken, "tiny-dense", "blockwise-fp32")
    assert cell.verdict == "error" and not cell.ok and "KeyError" in cell.detail, (cell.verdict, cell.detail)
    from fp8check.faults.matrix import summary
    assert summary([cell])["errors"] == 1 and not summary([cell])["ok"]
