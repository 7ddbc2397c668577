"""Scale tensors as the stacks name them on the wire (harness.layouts.scale_names, the one naming map): vLLM 0.26's
compressed-tensors MXFP8 (and SkyRL's mxfp8 wire) sends `<linear>.weight_scale` as uint8 E8M0 exponents, which
fp8check reads as its own `weight_scale_inv` (float8_e8m0fnu), the same bytes; a naming the recipe's wire does not use
is one finding, first in the report, that states the name vLLM loads."""
import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import SyncCheckFailed
from fp8check.harness.integrations.pytest_plugin import SyncChecker
from fp8check.harness.layouts.scale_names import canonical_scale, misnamed_scale

INV = "_scale_inv"


def renaming(suffix, view=None):
    """A sync that sends the learner's bytes, its scales renamed `<weight><suffix>` (and viewed as `view`)."""
    def sync(weights, masters, load):
        load([(n[: -len(INV)] + suffix, w.view(view) if view is not None else w) if n.endswith(INV) else (n, w)
              for n, w in weights.items()])
    return sync


def checker(recipe, model="tiny-dense"):
    cfg = recommended_config(model, recipe)
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    return SyncChecker(cfg, t, make_engine("rollout", "cpu-reference", cfg)), t


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_mxfp8_scales_under_vllm_naming_pass_and_land_as_sent(model):
    check, t = checker("mxfp8", model)
    check(renaming("_scale", torch.uint8))
    got = check.engine.kernel_tensors()
    # the bytes the engine holds are the learner's exponents, byte for byte (a numeric uint8 -> e8m0 cast would not
    # be: 127 -> 2^7's exponent 134)
    want = t.export_hf()["model.layers.0.self_attn.o_proj.weight_scale_inv"].view(torch.uint8)
    assert torch.equal(got["model.layers.0.self_attn.o_proj.weight_scale_inv"].view(torch.uint8), want)


def test_mxfp8_scales_under_fp8check_naming_pass():
    check, _ = checker("mxfp8")
    check(renaming(INV))


@pytest.mark.parametrize("recipe,suffix,view,expected,dtype", [
    ("blockwise-fp32", "_scale", None, "_scale_inv", "float32"),
])
def test_a_wrong_scale_name_is_one_finding_first_with_the_expected_name(recipe, suffix, view, expected, dtype):
    """First even beside other wire findings (one weight also sent in BF16: S5, S6 at stage wire)."""
    check, t = checker(recipe)
    q = "model.layers.0.self_attn.q_proj.weight"

    def sync(weights, masters, load):
        renaming(suffix, view)(weights, masters, lambda items: load([(n, masters[n] if n == q else w)
                                                                     for n, w in items]))
    with pytest.raises(SyncCheckFailed) as e:
        check(sync)
    fails = [f for f in e.value.findings if f.verdict == "fail"]
    first = fails[0]
    assert first.invariant_id == "S1" and first.evidence["stage"] == "naming"
    assert first.evidence["expected"] == first.tensor[: -len(suffix)] + expected and dtype in first.message
    n_scales = sum(1 for n in t.export_hf() if n.endswith(INV))
    assert first.evidence["count"] == n_scales
    naming = [f for f in fails if f.evidence.get("stage") == "naming"]
    assert len(naming) == 1
    # the "declared tensor not sent" and "sent but unknown" pairs it explains are not reported again
    assert not [f for f in fails if f.invariant_id == "S1" and f.evidence.get("stage") == "wire"]
    assert {(f.invariant_id, f.tensor) for f in fails if f.evidence.get("stage") == "wire"} >= {("S5", q), ("S6", q)}


def test_the_naming_map():
    e8 = torch.zeros(2, 4, dtype=torch.uint8)
    name, t = canonical_scale("m.layers.0.q_proj.weight_scale", e8, "mxfp8")
    assert name == "m.layers.0.q_proj.weight_scale_inv" and t.dtype == torch.float8_e8m0fnu
    assert t.data_ptr() == e8.data_ptr()                                  # a view: the same bytes
    assert canonical_scale("m.experts.w13_weight_scale", e8, "mxfp8")[0] == "m.experts.w13_weight_scale_inv"
    assert canonical_scale("m.q_proj.weight_scale", e8, "block") is None  # not a blockwise wire's naming
    assert canonical_scale("m.q_proj.weight_scale_inv", e8, "mxfp8") is None    # uint8 under fp8check's name: S5's
    assert canonical_scale("m.self_attn.k_scale", torch.ones(1), "mxfp8") is None   # a KV-cache scale
    assert misnamed_scale("m.q_proj.weight_scale", "block") == ("m.q_proj.weight", "m.q_proj.weight_scale_inv",
                                                                "float32")
    assert misnamed_scale("m.q_proj.weight_scale", "mxfp8") is None
    assert misnamed_scale("m.q_proj.weight", "block") is None
