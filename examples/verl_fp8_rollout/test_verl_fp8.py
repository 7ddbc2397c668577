"""verl 0.9.1's FP8 rollout weight sync, run from verl's own functions, under fp8check's pytest plugin: what
fp8check finds, model by model and recipe by recipe. Run: `pytest examples/verl_fp8_rollout` (verl 0.9.1
installed: `pip install --no-deps verl==0.9.1`).

Every expectation below follows from verl's mechanism (verl/utils/fp8_utils.py, verl/utils/kernel/fp8_kernel.py),
stated beside it; the tensors fp8check names are the ones that mechanism predicts."""
import logging

import pytest

import verl_loader

WHY = verl_loader.why_not()
if WHY:
    pytest.skip(WHY, allow_module_level=True)

from fp8check import SyncCheckFailed  # noqa: E402
from verl_sync import verl_fp8_rollout, verl_fp8_rollout_ignoring, verl_fp8_rollout_no_process_group  # noqa: E402

FP32, POW2 = "blockwise-fp32", "blockwise-pow2"
ALL_SYNC = {"S1", "S2", "S3", "S4", "S5", "S6", "S7"}
# verl's scaled_fp8_blockwise has two implementations: its PyTorch fallback, which verl runs where Triton cannot
# launch (this CPU suite, CI), and its Triton kernel, which verl runs on a GPU. Where they differ, both
# expectations are below (the Triton ones measured on an H200, Triton 3.6, torch 2.11).
PYTORCH = verl_loader.kernel_path() == "pytorch"


def on(model, recipe):
    return pytest.param(model, recipe, marks=pytest.mark.fp8check(model=model, recipe=recipe), id=f"{model}-{recipe}")


def failing(e):
    return {f.invariant_id for f in e.value.findings if f.verdict == "fail"}


def first(e):
    f = next(f for f in e.value.findings if f.verdict == "fail")
    return f.invariant_id, f.tensor


def named(e, inv):
    return {f.tensor for f in e.value.findings if f.verdict == "fail" and f.invariant_id == inv and f.tensor}


# -- the loader and verl's name rules (no fp8check yet: the mechanism the findings below follow from) -------------

def test_verl_runs_from_the_installed_package_without_its_init():
    import sys
    verl = verl_loader.load()
    root = verl_loader._package_dir()
    assert all(m.__file__.startswith(root) for m in vars(verl).values())
    assert getattr(sys.modules["verl"], "__file__", None) is None      # the stand-in: verl/__init__.py never ran
    assert "verl.protocol" not in sys.modules                           # nor verl.protocol, which needs ray
    assert verl_loader.installed_version() == verl_loader.VERL_VERSION


def test_verl_name_rules():
    verl = verl_loader.load()
    rule = verl.fp8_utils.FP8QuantizerHelper({"weight_block_size": [128, 128]}).should_quantize_param
    assert rule("model.layers.0.self_attn.q_proj.weight")
    assert not rule("model.layers.0.mlp.gate.weight")                  # the MoE router: "mlp.gate.weight" excluded
    assert rule("model.layers.0.mlp.shared_expert_gate.weight")        # included by "mlp"; no exclusion matches it
    assert not rule("model.layers.0.linear_attn.out_proj.weight")      # "out_proj" holds no include pattern
    assert not rule("model.layers.0.linear_attn.in_proj_qkv.weight")   # neither does in_proj_* (kept BF16: right)
    ignoring = verl.sglang_fp8_utils.SGLangFP8QuantizerHelper(
        verl.sglang_fp8_utils.build_sglang_fp8_quant_config(None, ignored_layers=["mlp.shared_expert_gate"]))
    assert not ignoring.should_quantize_param("model.layers.0.mlp.shared_expert_gate.weight")


# -- dense models ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model,recipe", [on("tiny-dense", FP32), on("tiny-rl", FP32)])
def test_dense_fp32(fp8check_sync, model, recipe):
    """PyTorch path: passes. It computes `torch.div(448., amax, out=...)` -- an eager division of a Python scalar
    by a tensor, one correctly rounded fp32 division (measured: not a reciprocal-multiply, unlike `448. / t` or a
    compiled `448 / amax`) -- then 1/scale, x * scale, clamp, RNE cast: Transformer Engine's blockwise rule with
    amax epsilon 0, which is what this recipe declares. The learner's FP8 forward weights are TE's quantization of
    the same BF16 weights, so verl re-quantizing the masters lands on the same bytes, and its name rules pick
    exactly the learner's FP8 GEMMs (q/k/v/o, gate/up/down) on these models.

    Triton path (a GPU): S2, S3, S4. The kernel stores `x_s = amax / 448` as the scale_inv where TE stores
    `1 / (448 / amax)`: a different rounding, one ulp apart for about half of all amax values (measured on the
    H200: 52% of 16.7M; Triton's `amax / 448` itself is correctly rounded there) -- S3 on the wire. It quantizes
    with `x * (1 / x_s)` instead of `x * (448 / amax)`, and Triton's `1.0 / x_s` is not correctly rounded (14% an
    ulp off): the few codes that sit next to a rounding midpoint land one step off (S2), and the dequantized
    weights of the blocks whose scale differs differ by that ulp (S4). Its fp32 -> e4m3 cast is RNE, as TE's
    (measured: no difference in 16.7M). Names, dtypes and the update are right."""
    if PYTORCH:
        fp8check_sync(verl_fp8_rollout)
        return
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(verl_fp8_rollout)
    assert failing(e) == {"S2", "S3", "S4"} and first(e)[0] == "S2"


@pytest.mark.parametrize("model,recipe", [on("tiny-dense", POW2), on("tiny-rl", POW2)])
def test_power_of_two_scales_are_not_what_verl_makes(fp8check_sync, model, recipe):
    """verl has no power-of-two scale mode: its scale is 448/amax in fp32, where a learner on TE's power-of-two
    block scales (Float8BlockScaling's default) rounds the scale down to 2^floor(log2(448/amax)). So every
    scale_inv verl sends is off the declared power-of-two grid (S3, on the wire), the codes -- quantized with
    the larger scale -- differ from the learner's (S2), and the dequantized weights differ (S4). Coverage, dtypes
    and exclusions (S1, S5, S6) and the update itself (S7) are right."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(verl_fp8_rollout)
    assert failing(e) == {"S2", "S3", "S4"}
    assert first(e) == ("S2", "model.layers.0.self_attn.q_proj.weight")
    s3 = next(f for f in e.value.findings if f.invariant_id == "S3" and f.verdict == "fail")
    assert s3.tensor == "model.layers.0.self_attn.q_proj.weight_scale_inv" and "power-of-two" in s3.message


# -- MoE: the shared-expert gate ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model,recipe", [on("tiny-moe", FP32), on("tiny-moe", POW2)])
def test_moe_shared_expert_gate_goes_out_fp8(fp8check_sync, model, recipe):
    """verl's exclusion list names the router as the substring "mlp.gate.weight", which
    `mlp.shared_expert_gate.weight` does not contain, and its include list has "mlp", which it does: verl quantizes
    the [1, hidden] shared-expert gate to FP8 with a [1, 4] scale_inv. The engine keeps that gate in BF16 (vLLM
    builds it as a plain linear without a quant method), so fp8check flags it on the wire (S5: FP8 sent where BF16
    is declared; S6: the exclusion sets disagree), first of all. The reference engine then refuses the bucket (a
    one-row weight cannot be split into 128x128 FP8 blocks), the exception leaves verl's update_weights half done:
    S7 (update did not complete), S1 (what verl had not yet sent, from layer 0's q/k/v on), and S2/S3/S4 (the
    engine still holds the poison there). The router itself is excluded correctly: no finding names it."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(verl_fp8_rollout)
    gate = "model.layers.0.mlp.shared_expert_gate.weight"      # layer 0's bucket is refused: layer 1 never goes
    assert failing(e) == ALL_SYNC
    assert first(e) == ("S5", gate)
    assert named(e, "S5") == {gate} and named(e, "S6") == {gate}
    assert not any(".mlp.gate.weight" in str(f.tensor) for f in e.value.findings if f.verdict == "fail")


@pytest.mark.parametrize("model,recipe", [on("tiny-moe", FP32), on("tiny-moe", POW2)])
def test_moe_with_the_gate_in_ignored_layers(fp8check_sync, model, recipe):
    """verl's own knob for it (quantization_config.ignored_layers / SGLANG_FP8_IGNORED_LAYERS, matched per dotted
    component) keeps the gate BF16: the MoE model then behaves as the dense ones (expert, shared-expert and attention
    GEMMs): it passes on the FP32 recipe on the PyTorch path, and fails S2/S3/S4 on power-of-two scales (and on the
    Triton path's scales)."""
    sync = verl_fp8_rollout_ignoring("mlp.shared_expert_gate")
    if recipe == FP32 and PYTORCH:
        fp8check_sync(sync)
        return
    with pytest.raises(SyncCheckFailed) as e:         # power-of-two scales, or the Triton path's 1-ulp scales
        fp8check_sync(sync)
    assert failing(e) == {"S2", "S3", "S4"}
    assert first(e)[0] == "S2"
    if recipe == POW2:
        assert first(e) == ("S2", "model.layers.0.self_attn.q_proj.weight")


# -- hybrid linear attention: out_proj ------------------------------------------------------------------------------

@pytest.mark.parametrize("model,recipe", [on("tiny-hybrid", FP32), on("tiny-hybrid", POW2)])
def test_hybrid_linear_attention_out_proj_goes_out_bf16(fp8check_sync, model, recipe):
    """verl's include list has "o_proj" but not "out_proj" (nor anything else in `linear_attn.out_proj.weight`):
    the Gated-DeltaNet output projection, an FP8 GEMM in the learner and the engine, goes out as the BF16 master.
    fp8check: S5 and S6 on the wire (BF16 sent where FP8 is declared), S1 (its scale_inv never sent), S2 (codes of
    the wrong dtype), and S3/S4 (the engine keeps the poison in that FP8 parameter). The in_proj_* projections
    verl also leaves BF16 are excluded by the model's config too, so they agree. On the FP32 recipe nothing else
    fails; on power-of-two scales every other FP8 GEMM adds the dense model's S2/S3/S4."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(verl_fp8_rollout)
    # layer 0 is the linear-attention layer; a Qwen3.5 checkpoint names its language model model.language_model
    out_proj = "model.language_model.layers.0.linear_attn.out_proj.weight"
    assert failing(e) == {"S1", "S2", "S3", "S4", "S5", "S6"}
    assert first(e) == ("S5", out_proj)
    assert named(e, "S5") == {out_proj} and named(e, "S6") == {out_proj}
    assert out_proj + "_scale_inv" in named(e, "S1")
    if recipe == FP32 and PYTORCH:
        # (checkpoint names on the wire, the engine's -- language_model.model.layers... -- in the engine)
        assert all(f.tensor is None or ".layers.0.linear_attn.out_proj" in f.tensor
                   for f in e.value.findings if f.verdict == "fail")


# -- no process group: verl's silent BF16 fallback ------------------------------------------------------------------

@pytest.mark.parametrize("model,recipe", [on(m, FP32) for m in ("tiny-dense", "tiny-rl", "tiny-moe", "tiny-hybrid")])
def test_without_a_process_group_everything_goes_out_bf16(fp8check_sync, fp8check_trainer, caplog, model, recipe):
    """quant_weights_by_name calls torch.distributed.get_rank() inside its try block; with no process group it
    raises, and the `except Exception` logs "Failed to quantize" and yields the BF16 tensor: every weight verl
    meant to quantize goes out BF16, and nothing fails loudly. fp8check: S5/S6 on every FP8 GEMM (first the first
    one in the masters' order), S1 (no scale_inv sent), S2/S3/S4 (the engine keeps the poison). No S7: the update
    completes -- on tiny-moe too, since the shared-expert gate now also goes BF16, which the engine accepts. The
    recipe does not matter (nothing is quantized), so one is enough."""
    import torch
    verl = verl_loader.load()
    masters = fp8check_trainer.master_hf()
    learner = fp8check_trainer.export_hf()
    fp8 = [n for n in masters if learner[n].dtype == torch.float8_e4m3fn]
    rule = verl.fp8_utils.FP8QuantizerHelper({"weight_block_size": [128, 128]}).should_quantize_param
    caplog.set_level(logging.ERROR)
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(verl_fp8_rollout_no_process_group)
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Failed to quantize")]
    assert len(failed) == sum(map(rule, masters)) and all("process group" in m for m in failed)
    assert failing(e) == ALL_SYNC - {"S7"}
    assert first(e) == ("S5", fp8[0])
    assert named(e, "S5") <= set(fp8)
