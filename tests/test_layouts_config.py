"""Layout maps (Megatron <-> HF <-> vLLM, TP narrowing) and the SyncConfig: exclusion matching, parsing, errors."""
import pytest
import torch
from faker import Faker
from hypothesis import given, strategies as st

from fp8check.harness import strategies as fst
from fp8check.harness.config import ConfigError, SyncConfig
from fp8check.harness.patterns import matches
from fp8check.harness.formats import get_recipe
from fp8check.harness.layouts import LayoutError, LayoutMap, Piece, scale_name, split_rank_name
from fp8check.harness.models import MODELS, get_model

fake = Faker()
Faker.seed(0)


def _quantized_megatron(cfg):
    out = {}
    for k, v in cfg.layout.hf_to_megatron(cfg.spec.init_weights(3)).items():
        if k in cfg.layout.fp8_megatron:
            out[k], out[scale_name(k)] = cfg.recipe.quantize_weight(v.to(torch.bfloat16))
        else:
            out[k] = v.to(torch.bfloat16)
    return out


@pytest.mark.parametrize("model", sorted(n for n in MODELS if n.startswith("tiny")))
@pytest.mark.parametrize("recipe", ["blockwise-fp32", "mxfp8"])
def test_fused_quantization_splits_exactly(model, recipe):
    """Quantizing Megatron's fused GEMMs and splitting codes + scales by block rows == quantizing each HF tensor."""
    cfg = SyncConfig(model=model, recipe=get_recipe(recipe))
    hf = cfg.layout.megatron_to_hf(_quantized_megatron(cfg))
    w = cfg.spec.init_weights(3)
    for n in cfg.fp8_tensors:
        q, s = cfg.recipe.quantize_weight(w[n].to(torch.bfloat16))
        assert torch.equal(hf[n].view(torch.uint8), q.view(torch.uint8)), n
        assert torch.equal(hf[scale_name(n)].view(torch.uint8), s.view(torch.uint8)), n


@pytest.mark.parametrize("model,tp", [("tiny-dense", 1), ("tiny-dense", 2), ("tiny-dense", 4), ("tiny-moe", 2),
                                      ("tiny-hybrid", 1)])
def test_vllm_layout_roundtrip(model, tp):
    cfg = SyncConfig.from_dict({"model": model, "rollout.tp_size": tp})
    hf = cfg.layout.megatron_to_hf(_quantized_megatron(cfg))
    ranks = [cfg.layout.hf_to_vllm(hf, r) for r in range(tp)]
    back = cfg.layout.vllm_to_hf(cfg.layout.ranks_to_params(ranks))
    assert set(back) == set(hf)
    for n in hf:
        assert torch.equal(back[n].view(torch.uint8), hf[n].view(torch.uint8)), n


def test_megatron_qkv_is_interleaved_per_group():
    cfg = SyncConfig(model="tiny-moe")                       # 4 heads, 2 KV groups, head_dim 128
    p = [x for x in cfg.layout.megatron if x.src == "decoder.layers.0.self_attention.linear_qkv.weight"]
    order = [(x.dst.rsplit(".", 2)[-2], x.dst_row, x.rows) for x in p]
    assert order == [("q_proj", 0, 256), ("k_proj", 0, 128), ("v_proj", 0, 128),
                     ("q_proj", 256, 256), ("k_proj", 128, 128), ("v_proj", 128, 128)]


def test_misaligned_split_is_a_layout_error():
    with pytest.raises(LayoutError, match="multiple of the block size"):
        Piece("a", "b", 0, 64, 64).scaled(128, 128, "a_s", "b_s")


def test_vllm_names_match_the_engine():
    """The names measured on vLLM 0.26 (shared/gpu/README.md, GPU conformance run)."""
    names = set(SyncConfig(model="tiny-moe").layout.vllm_param_shapes(0))
    for n in ("model.layers.0.mlp.experts.routed_experts.w13_weight",
              "model.layers.0.mlp.experts.routed_experts.w13_weight_scale_inv", "model.layers.0.mlp.gate.weight",
              "model.layers.0.self_attn.qkv_proj.weight_scale_inv", "model.layers.0.mlp.shared_expert.gate_up_proj.weight"):
        assert n in names


@given(st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), min_size=1, max_size=4))
def test_exclusion_matching_respects_component_boundaries(parts):
    module = "model.layers.3." + ".".join(parts)
    assert matches(module, parts[-1])
    assert matches(module, ".".join(parts))
    assert not matches(module + "_proj", parts[-1])            # `mlp.gate` never matches `gate_proj`
    assert not matches(module, parts[-1][:-1] + "X")


def test_gate_does_not_match_gate_proj_or_gate_up():
    cfg = SyncConfig(model="tiny-moe")
    assert "model.layers.0.mlp.gate" in cfg.ignored_layers
    assert not any("gate_proj" in m or "gate_up" in m for m in cfg.ignored_layers)


def test_config_dotted_and_nested_are_the_same():
    a = SyncConfig.from_dict({"model": "tiny-moe", "rollout.tp_size": 2, "recipe": "blockwise-pow2"})
    b = SyncConfig.from_dict({"model": "tiny-moe", "rollout": {"tp_size": 2}, "recipe": {"name": "blockwise-pow2"}})
    assert a == b and SyncConfig.from_dict(a.to_dict()) == a


@pytest.mark.parametrize("data,msg", [({"modle": "tiny-dense"}, "unknown key 'modle'"),
                                      ({"rollout": {"tp_size": "2"}}, "rollout.tp_size must be an integer, got .2."),
                                      ({"recipe": "blockwise-fp64"}, "unknown recipe"),
                                      ({"model": "tiny-xl"}, "unknown model"),
                                      ({"sync_mode": "lazy"}, "sync_mode"),
                                      ({"exclude": "mlp.gate"}, "exclude must be a list"),
                                      ({"rollout": {"kv_scale": float("inf")}}, "kv_scale must be finite and > 0"),
                                      ({"rollout": {"kv_scale": float("nan")}}, "kv_scale must be finite and > 0")])
def test_config_errors_name_the_key(data, msg):
    with pytest.raises(ConfigError, match=msg):
        SyncConfig.from_dict(data, "job.yaml")


def test_faker_config_fuzz_never_crashes():
    """Random keys and values: either a config or a ConfigError, never another exception."""
    for _ in range(300):
        key = fake.random_element(["model", "recipe", "rollout.tp_size", "trainer.fp8_param", fake.word(),
                                   "transport.bucket_bytes", "exclude", "rollout." + fake.word()])
        val = fake.random_element([fake.word(), fake.pyint(), fake.pybool(), [fake.word()], None, {"a": 1}])
        try:
            SyncConfig.from_dict({key: val})
        except ConfigError:
            pass


@given(fst.model_specs())
def test_generated_models_roundtrip(spec):
    cfg = SyncConfig(model=spec.name)
    LayoutMap(spec, cfg.fp8_tensors, (128, 128), tp=1)
    assert get_model(spec.name) is spec


def test_vllm_to_hf_strict_raises_and_tolerant_explains():
    """A rollout missing one fused parameter: the strict inverse names it; the tolerant one (what the checks
    use on a possibly broken engine) leaves exactly the affected HF tensors out and says why for each."""
    cfg = SyncConfig.from_dict({"model": "tiny-dense", "rollout.tp_size": 2})
    hf = cfg.layout.megatron_to_hf(_quantized_megatron(cfg))
    params = cfg.layout.ranks_to_params([cfg.layout.hf_to_vllm(hf, r) for r in range(2)])
    gone = next(k for k in params if "qkv_proj.weight" in k and "scale" not in k)
    del params[gone]
    with pytest.raises(LayoutError, match="qkv_proj.weight"):
        cfg.layout.vllm_to_hf(params)
    errors = {}
    back = cfg.layout.vllm_to_hf(params, errors=errors)
    layer = split_rank_name(gone)[1].split(".self_attn")[0]
    lost = {f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"}
    assert set(errors) == lost and all("qkv_proj.weight" in why for why in errors.values()), errors
    assert set(back) == set(hf) - lost
