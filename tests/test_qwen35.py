"""Qwen3.5 as vLLM 0.26 serves it: the model directory fp8check's vLLM engine writes is what vLLM's config class
takes, the engine parameter names fp8check's layout expects are the ones vLLM's model classes create (both read from
vLLM 0.26's own source, tests/vllm_source.py), the shipped configs carry the published shapes, the reference forward
computes what vLLM's Qwen3.5 computes (zero-centered norms, partial RoPE), the engine's float32 A_log is declared,
and the GDN faults and a live session on the CPU engines hold."""
import ast
import json
import os
import re

import pytest
import torch

import vllm_source as src
from fp8check import faults
from fp8check.e2e.live import LiveSession
from fp8check.faults import REAL_SHAPE_FAULTS, live_faults, real_shape_faults
from fp8check.harness.config import SyncConfig, recommended_config
from fp8check.harness.engines.cpu.perturbed import PerturbableRollout
from fp8check.harness.engines.cpu.rollout import ReferenceRollout
from fp8check.harness.engines.cpu.trainer import ReferenceTrainer
from fp8check.harness.engines.vllm import text_only_kwargs, write_model_dir
from fp8check.harness.layouts import FUSIONS, split_layer
from fp8check.harness.layouts.vllm import VLLM_PREFIXES, vllm_name
from fp8check.harness.models import MULTIMODAL, SERVED_AS, get_model, spec_from_hf_config, with_layers
from fp8check.harness.numerics import forward as fwd
from fp8check.harness.sync.pipeline import DigestFirst, run_sync

needs_source = pytest.mark.skipif(src.root() is None, reason=src.HOW)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny Qwen3.5-MoE (the registered MoE wrapper's form): one gated delta-net and one attention layer, 4 experts
# with a shared expert
TINY_MOE = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "tie_word_embeddings": False,
            "text_config": {"model_type": "qwen3_5_moe_text", "vocab_size": 1024, "hidden_size": 512,
                            "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
                            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
                            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 4,
                            "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                            "shared_expert_intermediate_size": 256, "rms_norm_eps": 1e-6,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                                "mrope_interleaved": True}}}


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-qwen35-moe")
    (d / "config.json").write_text(json.dumps(TINY_MOE))
    return get_model(str(d))


# -- vLLM 0.26's model classes: the parameter names they create ------------------------------------------------------
M = "vllm/model_executor/models/"
GDN = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
# (file, class) of every module class on the way from the registered wrapper to a parameter
CLASSES = {"Qwen3_5ForConditionalGeneration": M + "qwen3_5.py", "Qwen3_5MoeForConditionalGeneration": M + "qwen3_5.py",
           "Qwen3_5ForCausalLM": M + "qwen3_5.py", "Qwen3_5MoeForCausalLM": M + "qwen3_5.py",
           "Qwen3_5ForCausalLMBase": M + "qwen3_5.py", "Qwen3_5Model": M + "qwen3_5.py",
           "Qwen3_5DecoderLayer": M + "qwen3_5.py", "QwenGatedDeltaNetAttention": GDN,
           "Qwen3NextAttention": M + "qwen3_next.py", "Qwen3NextSparseMoeBlock": M + "qwen3_next.py",
           "Qwen2MoeMLP": M + "qwen2_moe.py"}
ALIASES = {"Qwen3NextMLP": "Qwen2MoeMLP"}               # qwen3_5.py: `from .qwen2_moe import Qwen2MoeMLP as Qwen3NextMLP`
WEIGHT = {"ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear", "RowParallelLinear",
          "ReplicatedLinear", "ParallelLMHead", "VocabParallelEmbedding", "Qwen3_5RMSNorm", "Qwen3NextRMSNorm",
          "RMSNormGated"}                              # modules whose one parameter is `weight`
NO_PARAMS = {"Attention", "ChunkGatedDeltaRule", "LogitsProcessor", "PPMissingLayer", "SiluAndMul"}
TOWER = {"Qwen3_VisionTransformer"}                   # built under _mark_tower_model: never registered at limit 0
# the routed experts: FusedMoE is a runner holding them as a child (layers/fused_moe/layer.py:367-405,
# runner/moe_runner.py:266), whose quant method registers w13_weight / w2_weight
FUSED_MOE = ("routed_experts.w13_weight", "routed_experts.w2_weight")


def _bases(name: str) -> list[str]:
    c = src.cls(CLASSES[name], name)
    return [b.id for b in c.bases if isinstance(b, ast.Name) and b.id in CLASSES]


def _init_of(name: str):
    """(class, its __init__ or the first base's that has one: Qwen3_5ForCausalLM has none)."""
    name = ALIASES.get(name, name)
    c = src.cls(CLASSES[name], name)
    try:
        return c, src.method(c, "__init__")
    except LookupError:
        return _init_of(_bases(name)[0])


def _calls_super_init(fn: ast.FunctionDef) -> bool:
    """`super().__init__(...)` (not `super(X, self).__init__()`, which skips X's)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"
               and isinstance(n.func.value, ast.Call) and src.constructed(n.func.value) == "super"
               and not n.func.value.args for n in ast.walk(fn))


def _children(name: str, *, layer_type: str, moe: bool, tied: bool) -> list[tuple[str, str]]:
    """(attribute, class) of the modules and parameters a class's __init__ registers, in registration order, for
    one decoder layer's type and the model's MLP kind (the branches the class's code takes on them)."""
    c, init = _init_of(name)
    out = []
    if _calls_super_init(init) and _bases(c.name):          # the base's registrations come first
        out += _children(_bases(c.name)[0], layer_type=layer_type, moe=moe, tied=tied)
    for attr, value in src.self_assignments(init):
        made = src.constructed(value)
        if made is not None and isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Name) \
                and value.func.value.id == "self":     # self.create_qkvz_proj(...): what the method returns
            ret = [n for n in ast.walk(src.method(c, made)) if isinstance(n, ast.Return)]
            made = src.constructed(ret[0].value) if ret else None
        if made is None or made[:1].islower() and attr != "layers":
            continue                               # a reference to a module made elsewhere, or a plain value
        out.append((attr, made))
    # the branches this model takes (the code: `if self.layer_type == "linear_attention"`, MoE by model type)
    skip = {"self_attn"} if layer_type == "linear_attention" else {"linear_attn"}
    out = [(a, m) for a, m in out if a not in skip]
    if name == "Qwen3_5DecoderLayer":
        out = [(a, m) for a, m in out if a != "mlp" or m == ("Qwen3NextSparseMoeBlock" if moe else "Qwen3NextMLP")]
        out = [(a, m) for a, m in out if a not in ("attn_layer_scale", "ffn_layer_scale")]   # config.layer_scale only
    if name == "Qwen3_5ForCausalLMBase":
        out = [(a, m) for a, m in out if a != "lm_head" or (m == "ParallelLMHead" and not tied)]
    return out


def vllm_param_names(spec) -> set[str]:
    """The parameter names vLLM 0.26's registered class for `spec` creates, walked from its source."""
    moe, tied = spec.is_moe, spec.tie_word_embeddings
    names: list[str] = []

    def walk(cls_name: str, prefix: str, layer_type: str = "full_attention"):
        for attr, made in _children(cls_name, layer_type=layer_type, moe=moe, tied=tied):
            made = ALIASES.get(made, made)
            if made in TOWER or made in NO_PARAMS or made is None:
                continue
            if attr == "layers":                           # make_layers(..., get_layer): Qwen3_5DecoderLayer each
                for i, lt in enumerate(spec.layer_types):
                    walk("Qwen3_5DecoderLayer", f"{prefix}layers.{i}.", lt)
            elif made in WEIGHT:
                names.append(f"{prefix}{attr}.weight")
            elif made == "Parameter":
                names.append(f"{prefix}{attr}")
            elif made == "FusedMoE":
                names.extend(f"{prefix}{attr}.{p}" for p in FUSED_MOE)
            elif made in CLASSES or made in ALIASES.values():
                walk(made, f"{prefix}{attr}.", layer_type)
            else:
                raise AssertionError(f"{cls_name}.{attr} = {made}(...): a module class this test does not know; "
                                     f"vLLM's Qwen3.5 changed: extend CLASSES / WEIGHT / NO_PARAMS")
    walk(spec.architecture, "")
    out = set()
    for n in names:                                    # named_parameters: the first path of a module wins
        if n not in out:
            out.add(n)
    return out


def layout_weight_names(spec_name: str) -> set[str]:
    cfg = recommended_config(spec_name, "blockwise-fp32")
    return {n for n in cfg.layout.vllm_param_shapes(0) if not n.endswith("_scale_inv")}


@needs_source
@pytest.mark.parametrize("model", ["tiny-hybrid", "qwen3.5-9b@4L", "tiny-moe-hybrid", "qwen3.5-35b-a3b@2L"])
def test_layout_names_are_the_parameters_vllms_qwen35_classes_create(model, tiny_moe):
    """Every engine parameter fp8check's layout maps checkpoint tensors to is one vLLM 0.26's registered Qwen3.5 class
    creates (walked from its source: the wrapper, language_model, model, layers, linear_attn / self_attn, mlp), and
    no other: the names `fp8check_info` must report live."""
    name = tiny_moe.name if model == "tiny-moe-hybrid" else model
    spec = get_model(name)
    assert vllm_param_names(spec) == layout_weight_names(name)


@needs_source
def test_qwen35_is_registered_only_as_its_conditional_generation_classes():
    """vLLM 0.26's registry has the two wrappers and no text-only Qwen3.5 class; its config registry gives them
    the nested config classes: why fp8check serves a Qwen3.5 text spec as SERVED_AS says."""
    reg = src.text("vllm/model_executor/models/registry.py")
    for arch in MULTIMODAL:
        assert re.search(rf'"{arch}": \(\s*"qwen3_5",\s*"{arch}",?\s*\)', reg), arch
    assert '"Qwen3_5ForCausalLM"' not in reg and '"Qwen3_5MoeForCausalLM"' not in reg
    cfgs = src.text("vllm/transformers_utils/config.py")
    for arch, top in MULTIMODAL.items():
        assert re.search(rf"\b{top}=\"{'Qwen3_5MoeConfig' if 'Moe' in arch else 'Qwen3_5Config'}\"", cfgs), top
    assert {a for a, _ in SERVED_AS.values()} == set(MULTIMODAL)


@needs_source
def test_checkpoint_prefixes_are_the_wrappers_hf_to_vllm_mapper():
    """The language model's checkpoint -> parameter prefixes (VLLM_PREFIXES) are the ones the wrapper's
    hf_to_vllm_mapper applies (inherited from Qwen3VLForConditionalGeneration), and the wrapper inherits it."""
    mapper = src.class_attr(src.cls(M + "qwen3_vl.py", "Qwen3VLForConditionalGeneration"), "hf_to_vllm_mapper")
    want = src.call_keyword(mapper, "WeightsMapper", "orig_to_new_prefix")
    for arch in MULTIMODAL:
        assert dict(VLLM_PREFIXES[arch]) == want
    wrapper = src.cls(M + "qwen3_5.py", "Qwen3_5ForConditionalGeneration")
    with pytest.raises(LookupError):                       # not overridden: Qwen3VL's applies
        src.class_attr(wrapper, "hf_to_vllm_mapper")
    assert "Qwen3VLForConditionalGeneration" in [b.id for b in wrapper.bases if hasattr(b, "id")]


@needs_source
def test_fusions_are_vllms_stacked_mapper_and_packed_modules_for_qwen35():
    """Every fused parameter of a Qwen3.5 model: members in the order vLLM stacks them (Qwen3_5Model's and
    Qwen3NextModel's orig_to_new_stacked: shard ids rising with fp8check's member order) and the member list the
    quant config matches ignored_layers through (the wrapper's packed_modules_mapping, in order)."""
    stacked = {**src.call_keyword(src.class_attr(src.cls(M + "qwen3_next.py", "Qwen3NextModel"), "hf_to_vllm_mapper"),
                                  "WeightsMapper", "orig_to_new_stacked"),
               **src.call_keyword(src.class_attr(src.cls(M + "qwen3_5.py", "Qwen3_5Model"), "hf_to_vllm_mapper"),
                                  "WeightsMapper", "orig_to_new_stacked")}
    packed = {**src.dict_literals(src.class_attr(src.cls(M + "qwen3_vl.py", "Qwen3VLForConditionalGeneration"),
                                                 "packed_modules_mapping")),
              **src.dict_literals(src.class_attr(src.cls(M + "qwen3_5.py", "Qwen3_5ForConditionalGeneration"),
                                                 "packed_modules_mapping"))}
    checked = 0
    for fused, members in FUSIONS:
        leaf = fused.rsplit(".", 1)[1]
        if leaf not in packed:
            continue
        checked += 1
        assert packed[leaf] == [m.rsplit(".", 1)[1] for m, _ in members], fused
        order = []
        for m, _ in members:
            key = next(k for k in stacked if ("." + m).endswith(k))       # the mapper matches a name's substring
            target, shard = stacked[key]
            assert target.rsplit(".", 1)[1] == leaf, (m, target)
            order.append(min(shard) if isinstance(shard, tuple) else shard)
        assert order in (["q", "k", "v"], sorted(order)), (fused, order)      # stacked in fp8check's member order
    assert checked == 5          # qkv_proj, gate_up_proj (MLP and shared expert), in_proj_qkvz, in_proj_ba


@needs_source
def test_the_engines_float32_a_log_is_the_model_classes():
    """vLLM's gated delta-net holds A_log in float32 (an explicit dtype), dt_bias in the model dtype: fp8check's
    spec declares exactly A_log (ModelSpec.engine_fp32) and the layout the engine dtype per parameter."""
    init = src.method(src.cls(GDN, "QwenGatedDeltaNetAttention"), "__init__")
    made = {a: v for a, v in src.self_assignments(init)}
    dumps = {a: ast.dump(made[a]) for a in ("A_log", "dt_bias")}
    assert "float32" in dumps["A_log"] and "float32" not in dumps["dt_bias"]
    for model in ("tiny-hybrid", "qwen3.5-9b@4L", "qwen3.5-35b-a3b@2L"):
        cfg = recommended_config(model, "blockwise-fp32")
        fp32 = {n for n in cfg.layout.vllm_param_shapes(0) if cfg.layout.engine_dtype(n) == "float32"}
        gdn = sum(t == "linear_attention" for t in cfg.spec.layer_types)
        assert len(fp32) == gdn and all(n.endswith(".linear_attn.A_log") for n in fp32), fp32


# -- the config.json fp8check's engine writes -----------------------------------------------------------------------
TEXT_CLASS_FIELDS = {"qwen3_5": ("vllm/transformers_utils/configs/qwen3_5.py", "Qwen3_5TextConfig"),
                     "qwen3_5_moe": ("vllm/transformers_utils/configs/qwen3_5_moe.py", "Qwen3_5MoeTextConfig")}
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "layer_types", "tie_word_embeddings",
                "rope_parameters", "rms_norm_eps", "intermediate_size", "moe_intermediate_size",
                "shared_expert_intermediate_size", "num_experts_per_tok", "num_experts")


def written(model: str, tmp_path) -> tuple[SyncConfig, dict]:
    cfg = recommended_config(model, "blockwise-fp32")
    d = write_model_dir(cfg, str(tmp_path / "m"), cfg.ignored_layers)
    with open(os.path.join(d, "config.json")) as f:
        return cfg, json.load(f)


@needs_source
@pytest.mark.parametrize("model", ["tiny-hybrid", "qwen3.5-9b@4L", "qwen3.5-35b-a3b@2L"])
def test_written_config_gives_every_shape_field_of_vllms_text_config_class(model, tmp_path):
    """The nested config.json names every parameter of vLLM's text config class that sets a shape (read from its
    __init__ signature), so none is left to the class's defaults (Qwen3.5-9B's), with the spec's value."""
    cfg, c = written(model, tmp_path)
    spec = cfg.spec
    rel, name = TEXT_CLASS_FIELDS[c["model_type"]]
    params = [a.arg for a in src.method(src.cls(rel, name), "__init__").args.args[1:]]
    want = [f for f in SHAPE_FIELDS if f in params]
    assert len(want) >= 16, want
    text = c["text_config"]
    missing = [f for f in want if f not in text and not (f == "intermediate_size" and spec.is_moe)]
    assert not missing, missing
    assert c["architectures"] == [spec.architecture] and c["model_type"] == MULTIMODAL[spec.architecture]
    assert text["model_type"] == spec.model_type and text["layer_types"] == list(spec.layer_types)
    assert (text["hidden_size"], text["num_hidden_layers"], text["head_dim"]) == \
        (spec.hidden_size, spec.num_layers, spec.head_dim)
    assert text["rope_parameters"]["partial_rotary_factor"] == spec.partial_rotary_factor
    vis = src.method(src.cls(rel, name.replace("Text", "Vision")), "__init__")
    vis_params = {a.arg for a in vis.args.args[1:]}
    assert set(c["vision_config"]) <= vis_params and c["vision_config"]["out_hidden_size"] == spec.hidden_size
    assert c["quantization_config"]["ignored_layers"] == list(cfg.ignored_layers)


def _transformers():
    try:
        import transformers  # noqa: F401
        return transformers
    except ImportError:
        return None


@needs_source
@pytest.mark.skipif(_transformers() is None, reason="transformers is not installed (vLLM 0.26 needs >= 5.5.3: "
                    "pip install 'transformers>=5.5.3', or put it on PYTHONPATH for this test)")
@pytest.mark.parametrize("model", ["tiny-hybrid", "qwen3.5-9b@4L", "qwen3.5-35b-a3b@2L"])
def test_vllms_config_class_takes_the_written_config(model, tmp_path):
    """vLLM 0.26's own Qwen3_5Config / Qwen3_5MoeConfig (loaded from its source file) builds from the config.json
    fp8check writes: the text config class it gives the language model (not the Qwen3_5TextConfig that made vLLM's
    multimodal processor raise), every dim the spec's, RoPE standardized and validated as vLLM's
    patch_rope_parameters does, the vision config the tower is built from."""
    import importlib.util
    cfg, c = written(model, tmp_path)
    spec = cfg.spec
    rel, text_name = TEXT_CLASS_FIELDS[c["model_type"]]
    mod_spec = importlib.util.spec_from_file_location(f"_vllm_026_{c['model_type']}_config", src.path(rel))
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    top = getattr(mod, text_name.replace("TextConfig", "Config"))(**c)
    t = top.text_config
    assert type(t).__name__ == text_name and t.model_type == spec.model_type
    assert top.model_type == MULTIMODAL[spec.architecture]
    got = (t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
           t.head_dim, t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim,
           t.linear_conv_kernel_dim, list(t.layer_types), t.tie_word_embeddings, t.attn_output_gate)
    assert got == (spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.linear_num_k_heads, spec.linear_num_v_heads, spec.linear_head_dim,
                   spec.linear_conv_kernel, list(spec.layer_types), spec.tie_word_embeddings, True)
    if spec.is_moe:
        assert (t.num_experts, t.num_experts_per_tok, t.moe_intermediate_size, t.shared_expert_intermediate_size) == \
            (spec.num_experts, spec.top_k, spec.moe_intermediate_size, spec.shared_expert_intermediate_size)
    else:
        assert t.intermediate_size == spec.intermediate_size
    t.standardize_rope_params()
    t.validate_rope()
    rp = t.rope_parameters
    assert rp["rope_type"] == "default" and rp["rope_theta"] == spec.rope_theta
    assert rp["partial_rotary_factor"] == spec.partial_rotary_factor
    assert sum(rp["mrope_section"]) == spec.rotary_dim // 2          # MRotaryEmbedding's sections: the rotated half
    assert top.vision_config.out_hidden_size == spec.hidden_size and top.tie_word_embeddings == spec.tie_word_embeddings


def test_model_dir_and_engine_arguments_for_a_multimodal_wrapper(tmp_path):
    """A Qwen3.5 spec's model directory is the nested form; its ignored_layers, in checkpoint names, land through the
    wrapper's prefixes on modules the engine has; the engine starts text-only (every modality's limit 0); a text
    model's directory stays flat and starts with no multimodal argument."""
    cfg, c = written("tiny-hybrid", tmp_path)
    assert "text_config" in c and "vision_config" in c and "hidden_size" not in c
    engine_modules = {n.rsplit(".", 1)[0] for n in cfg.layout.vllm_param_shapes(0)}
    for m in c["quantization_config"]["ignored_layers"]:
        assert m.startswith("model.language_model.layers.")
        mapped = vllm_name(cfg.spec, m + ".")[:-1]
        prefix, local = split_layer(mapped)
        fused = next((f for f, members in FUSIONS if local in [x for x, _ in members]), local)
        assert prefix + fused in engine_modules, (m, mapped)
    assert text_only_kwargs(cfg) == {"limit_mm_per_prompt": {"image": 0, "video": 0}}
    dense = recommended_config("tiny-dense", "blockwise-fp32")
    d = write_model_dir(dense, str(tmp_path / "dense"))
    flat = json.load(open(os.path.join(d, "config.json")))
    assert "text_config" not in flat and flat["architectures"] == ["Qwen3ForCausalLM"]
    assert text_only_kwargs(dense) == {}


@needs_source
def test_text_only_start_limits_exactly_the_modalities_vllms_qwen35_supports():
    """The limits fp8check passes name the modalities Qwen3.5's processing info supports (Qwen2-VL's
    get_supported_mm_limits, inherited through Qwen3VLProcessingInfo): image and video, each 0."""
    fn = src.method(src.cls(M + "qwen2_vl.py", "Qwen2VLProcessingInfo"), "get_supported_mm_limits")
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    keys = {k.value for k in ret.value.keys}
    assert set(text_only_kwargs(recommended_config("tiny-hybrid", "blockwise-fp32"))["limit_mm_per_prompt"]) == keys
    assert "_mark_tower_model(vllm_config, {\"image\", \"video\"})" in src.text(M + "qwen3_5.py")


# -- the published shapes ---------------------------------------------------------------------------------------------
# Written out here, not read from the shipped files. Qwen3.5-9B: the model card (huggingface.co/Qwen/Qwen3.5-9B: 32
# layers, 8 x (3 x Gated DeltaNet + 1 x Gated Attention), hidden 4096, FFN 12288, GDN 32 V / 16 QK heads of 128,
# attention 16 Q / 4 KV heads of 256, RoPE on 64 dims, vocabulary 248320, 262144 context) and THUDM/slime
# scripts/models/qwen3.5-9B.sh (norm eps 1e-6, rotary base 1e7, untied embeddings). Qwen3.5-35B-A3B: its config.json
# (revision ec2d4ece: 40 layers, hidden 2048, 256 experts, 8 per token, expert and shared-expert width 512, the same
# GDN and RoPE) and slime's qwen3.5-35B-A3B.sh (16 Q / 2 KV heads of 256, untied). fp8check/harness/model_configs/
# SOURCES.md has the citations.
PUBLIC = {
    "qwen3.5-9b": dict(architecture="Qwen3_5ForConditionalGeneration", model_type="qwen3_5_text", hidden_size=4096,
                       num_layers=32, num_heads=16, num_kv_heads=4, head_dim=256, intermediate_size=12288,
                       vocab_size=248320, linear_num_k_heads=16, linear_num_v_heads=32, linear_head_dim=128,
                       linear_conv_kernel=4, rms_norm_eps=1e-6, rope_theta=1e7, partial_rotary_factor=0.25,
                       tie_word_embeddings=False, num_experts=0, attn_output_gate=True, zero_centered_norms=True,
                       max_position_embeddings=262144),
    "qwen3.5-35b-a3b": dict(architecture="Qwen3_5MoeForConditionalGeneration", model_type="qwen3_5_moe_text",
                            hidden_size=2048, num_layers=40, num_heads=16, num_kv_heads=2, head_dim=256,
                            num_experts=256, top_k=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                            vocab_size=248320, linear_num_k_heads=16, linear_num_v_heads=32, linear_head_dim=128,
                            linear_conv_kernel=4, rms_norm_eps=1e-6, rope_theta=1e7, partial_rotary_factor=0.25,
                            tie_word_embeddings=False, attn_output_gate=True, zero_centered_norms=True,
                            max_position_embeddings=262144),
}
# the language model's parameters: 9B (the card's "9B"; the GGUF of the text model reports 8.95 B) and 35B total
PUBLIC_PARAMS = {"qwen3.5-9b": 8.95e9, "qwen3.5-35b-a3b": 34.7e9}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_shipped_qwen35_configs_have_the_published_shapes(name):
    spec = get_model(name)
    for k, v in PUBLIC[name].items():
        assert getattr(spec, k) == v, (k, getattr(spec, k), v)
    assert spec.layer_types == tuple("full_attention" if i % 4 == 3 else "linear_attention"
                                     for i in range(spec.num_layers))
    assert abs(spec.num_params() - PUBLIC_PARAMS[name]) / PUBLIC_PARAMS[name] < 0.01
    assert spec.live and not spec.unmodelled and spec.weight_init == "per-tensor"
    assert spec.lm_prefix == "model.language_model" and spec.engine_fp32 == ("linear_attn.A_log",)


@pytest.mark.parametrize("name,layers", [("qwen3.5-9b", 4), ("qwen3.5-35b-a3b", 2)])
def test_qwen35_layer_cut_and_the_default_exclusion_is_closed_under_both_fusions(name, layers):
    """`--layers N` keeps every per-layer shape (the first full-attention layer of Qwen3.5 is layer 3); the default
    exclusion keeps the whole GDN in_proj in BF16 -- vLLM needs b / a in BF16, Megatron-Core quantizes
    [q|k|v|z|b|a] whole -- so the layout map builds (a split exclusion raises there) and the MoE router and shared-
    expert gate (built without a quant config by Qwen3NextSparseMoeBlock) are high precision on both sides."""
    cut = get_model(with_layers(name, layers))
    assert cut.num_layers == layers and cut.layer_types == get_model(name).layer_types[:layers]
    cfg = recommended_config(cut.name, "blockwise-fp32")
    cfg.layout                                              # LayoutError if the exclusion splits a fused GEMM
    gdn = [i for i, t in enumerate(cut.layer_types) if t == "linear_attention"]
    assert gdn
    for i in gdn:
        for m in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            assert f"{cut.layer_prefix(i)}linear_attn.{m}.weight" in cfg.high_precision
        assert f"{cut.layer_prefix(i)}linear_attn.out_proj.weight" in cfg.fp8_tensors
    if cut.is_moe:
        assert {"mlp.gate", "mlp.shared_expert_gate"} <= set(cut.engine_high_precision)


def test_spec_from_a_nested_config_reads_the_top_level_architecture_and_v5_rope(tiny_moe):
    """A wrapper's config: the architecture from the top level (the text config has none), RoPE theta and the
    partial factor from rope_parameters, layer types from full_attention_interval where they are not listed."""
    assert tiny_moe.architecture == "Qwen3_5MoeForConditionalGeneration" and tiny_moe.is_moe
    vl = spec_from_hf_config({"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
                              "text_config": {k: v for k, v in TINY_MOE["text_config"].items()
                                              if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                       "head_dim", "vocab_size")}}, "vl")
    assert vl.architecture == "Qwen3VLForConditionalGeneration" and not vl.live      # not a layout fp8check serves
    assert (tiny_moe.rope_theta, tiny_moe.partial_rotary_factor, tiny_moe.rotary_dim) == (1e7, 0.25, 32)
    assert tiny_moe.hf_config()["text_config"]["rope_parameters"]["mrope_section"] == [11, 11, 10]
    inferred = {**TINY_MOE, "text_config": {k: v for k, v in TINY_MOE["text_config"].items() if k != "layer_types"}}
    inferred["text_config"].update(num_hidden_layers=8, full_attention_interval=4)
    s = spec_from_hf_config(inferred, "inferred")
    assert s.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + \
        ("full_attention",)


def test_a_text_spec_of_qwen35_is_served_as_the_wrapper_and_round_trips():
    """A spec written as Qwen3.5's text model (model_type qwen3_5_text) is the registered wrapper with the released
    checkpoint names; its written config.json reads back to the same tensors (names and shapes)."""
    from fp8check.harness.models import ModelSpec
    s = ModelSpec("t35", "Qwen3_5ForCausalLM", "qwen3_5_text", layer_types=("linear_attention", "full_attention"),
                  num_kv_heads=2, linear_num_k_heads=2, linear_num_v_heads=4, attn_output_gate=True)
    assert s.architecture == "Qwen3_5ForConditionalGeneration" and s.lm_prefix == "model.language_model"
    # what vLLM's class holds, whatever the hand-built spec says: GemmaRMSNorms, the float32 A_log
    assert s.zero_centered_norms and s.engine_fp32 == ("linear_attn.A_log",)
    assert s.tensors()[0].name == "model.language_model.embed_tokens.weight"
    spec = get_model("tiny-hybrid")
    back = spec_from_hf_config(spec.hf_config(), "back")
    assert [(t.name, t.shape) for t in back.tensors()] == [(t.name, t.shape) for t in spec.tensors()]
    assert (back.partial_rotary_factor, back.zero_centered_norms, back.engine_fp32) == \
        (spec.partial_rotary_factor, True, spec.engine_fp32)


# -- the reference forward computes what vLLM's Qwen3.5 computes -----------------------------------------------------
def test_partial_rope_turns_the_leading_dims_only():
    """RoPE on the first rotary_dim dims (vLLM's get_rope with partial_rotary_factor; MRoPE with the three positions
    equal, as on text), by complex rotation at theta^(-2i/R), the rest passed through."""
    x = torch.randn(5, 3, 128, generator=torch.Generator().manual_seed(0))
    R, theta = 32, 1e7
    out = fwd._rope(x, theta, start=2, dims=R)
    pos = torch.arange(2, 7, dtype=torch.float64)[:, None]
    freqs = theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    z = torch.complex(x[..., : R // 2].double(), x[..., R // 2:R].double()) * torch.polar(
        torch.ones(5, R // 2, dtype=torch.float64), pos * freqs)[:, None, :]
    want = torch.cat([z.real, z.imag, x[..., R:].double()], -1)
    assert torch.allclose(out.double(), want, atol=1e-5)
    assert torch.equal(out[..., R:], x[..., R:])


def test_zero_centered_norms_scale_by_one_plus_weight_except_the_gdn_output_norm():
    """The reference forward of a zero-centered model (vLLM's GemmaRMSNorm for the decoder, q / k and final norms)
    equals that of the same model without it whose norm weights are 1 + w -- all but the gated delta-net's output
    norm (RMSNormGated: its weight as is), which keeps w."""
    from dataclasses import replace
    spec = get_model("tiny-hybrid")
    plain = replace(spec, name="tiny-hybrid-plain", model_type="plain-norms", zero_centered_norms=False)
    assert spec.zero_centered_norms and not plain.zero_centered_norms
    w = spec.init_weights(7)
    shifted = {n: (t + 1.0 if n.endswith("norm.weight") and ".linear_attn." not in n else t) for n, t in w.items()}
    toks = [3, 17, 99, 5, 1000, 42]
    a = fwd.logits(spec, fwd.Weights(w, frozenset(), None), toks)
    b = fwd.logits(plain, fwd.Weights(shifted, frozenset(), None), toks)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    c = fwd.logits(spec, fwd.Weights(shifted, frozenset(), None), toks)
    assert not torch.allclose(a, c, atol=1e-3)


# -- the engine's float32 A_log ----------------------------------------------------------------------------------------
class _BF16ALog(ReferenceRollout):
    """An engine that holds A_log in BF16 (not vLLM's float32)."""

    def _create(self, rank):
        out = super()._create(rank)
        return {n: (t.to(torch.bfloat16) if n.endswith("A_log") else t) for n, t in out.items()}


def test_engine_a_log_in_float32_syncs_clean_and_bf16_is_s5():
    """The reference engine holds A_log in float32 as vLLM does: a clean digest-first sync fetches nothing and
    passes; an engine holding it in BF16 is S5's finding, naming the parameter and the declared float32."""
    cfg = recommended_config("tiny-hybrid", "blockwise-fp32")
    tr = ReferenceTrainer(cfg)
    tr.optimizer_step()
    ro = ReferenceRollout(cfg)
    assert {n: t.dtype for n, t in ro.params[0].items() if n.endswith("A_log")} == \
        {"language_model.model.layers.0.linear_attn.A_log": torch.float32}
    res = run_sync(cfg, tr, ro, capture=DigestFirst())
    assert res.fetched == 0 and not [f for f in res.findings if f.verdict != "pass"]
    res = run_sync(cfg, tr, _BF16ALog(cfg), capture=DigestFirst())
    s5 = [f for f in res.findings if f.invariant_id == "S5" and f.verdict == "fail"]
    assert [(f.tensor, f.message) for f in s5] == [("language_model.model.layers.0.linear_attn.A_log",
                                                    "engine holds bfloat16, declared float32")]


# -- faults: the GDN's own and the real-shape sets ----------------------------------------------------------------------
@pytest.mark.parametrize("model,layers", [(m, 4 if "30b" not in m and "35b" not in m else 2) for m in REAL_SHAPE_FAULTS])
def test_real_shape_fault_sets_apply_at_the_gpu_plans_depths(model, layers):
    """Every fault of a real-shape set exists and is injectable into engines running the model at the depth the GPU
    plan cuts it to (ci/gpu_qwen35.sh, ci/gpu_live.sh, tests/gpu/test_real_scale.py): none is silently n/a."""
    cfg = recommended_config(with_layers(model, layers), "blockwise-fp32")
    names = real_shape_faults(cfg.spec.name)
    from fp8check.harness.engines.vllm import VLLMEngine
    for n in names:
        assert faults.FAULTS[n].live_injectable(cfg, VLLMEngine.knobs), n
    assert real_shape_faults(model) == names
    with pytest.raises(LookupError, match="no real-shape fault set"):
        real_shape_faults("tiny-dense")


def test_gdn_faults_target_a_gdn_layer_and_apply_only_to_hybrid_models():
    dense, hybrid = recommended_config("tiny-dense", "blockwise-fp32"), recommended_config("tiny-hybrid", "mxfp8")
    for n in ("gdn_in_proj_misordered", "gdn_a_log_dt_bias_swapped"):
        assert not faults.FAULTS[n].applies(dense) and faults.FAULTS[n].applies(hybrid)
        assert n in live_faults(hybrid, PerturbableRollout.knobs)
    # a config that sends the in_proj members in FP8 has no BF16 rows to mis-split
    fp8_in_proj = recommended_config("tiny-hybrid", "blockwise-fp32").with_(default_exclude=False)
    assert not faults.FAULTS["gdn_in_proj_misordered"].applies(fp8_in_proj)


CPU = dict(trainer="cpu-reference", rollout="cpu-reference", ray=False)
HYBRID_LIVE = ("gdn_in_proj_misordered", "gdn_a_log_dt_bias_swapped", "megatron_qkv_not_deinterleaved",
               "scale_x2_block", "postprocess_twice", "stale_layer_unstamped")


@pytest.fixture(scope="module")
def hybrid_session():
    with LiveSession(recommended_config("tiny-hybrid", "blockwise-fp32"), **CPU) as s:
        s.step()
        yield s


def test_tiny_hybrid_live_session_clean_sync(hybrid_session):
    """The live session on the CPU engines (`fp8check live --model tiny-hybrid` runs the same against vLLM): a clean
    sync moves nothing, passes every check and P1 on the engines' own log-probs."""
    o = hybrid_session.sync("clean", probes=True)
    assert not o.fired and not o.unknown, o.to_json()
    assert o.fetched == 0 and o.params == 29
    assert next(f for f in o.findings if f.invariant_id == "P1").verdict == "pass"


@pytest.mark.parametrize("name", HYBRID_LIVE)
def test_tiny_hybrid_live_faults_are_caught(hybrid_session, name):
    f = faults.FAULTS[name]
    assert name in live_faults(hybrid_session.config, PerturbableRollout.knobs)
    o, again = hybrid_session.sync(name, fault=f), hybrid_session.sync("again")
    assert f.verdict(o.fired) == "caught" and not f.undeclared(o.fired), (name, o.fired, f.trips)
    assert not again.fired and not again.unknown, again.to_json()


# -- the live CLI -------------------------------------------------------------------------------------------------------
def test_live_refuses_the_megatron_trainer_for_a_hybrid_model_in_one_line():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "fp8check", "live", "--model", "tiny-hybrid"], capture_output=True,
                       text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "gated delta-net" in p.stderr and "--trainer cpu-reference" in p.stderr


def test_reference_learner_on_a_device_holds_the_device_paths_masters_and_syncs_clean():
    """The reference learner on the device path (here its code on the CPU device): its masters are
    `device_masters` chained step by step, as the Megatron/TE adapter's there; a sync of its export is clean, and a
    previous step is refused, not recomputed from other masters."""
    from dataclasses import replace
    from fp8check.harness.engines.cpu.masters import device_masters
    cfg = recommended_config("tiny-hybrid", "blockwise-fp32")
    cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    tr = ReferenceTrainer(cfg, device="cpu")
    tr.optimizer_step()
    tr.optimizer_step()
    m0 = device_masters(cfg.layout, cfg.seed, 0, "cpu")
    m2 = device_masters(cfg.layout, cfg.seed, 2, "cpu", prev=device_masters(cfg.layout, cfg.seed, 1, "cpu", prev=m0))
    assert all(torch.equal(tr.masters[n], m2[n]) for n in m2)
    assert tr.engine == "reference-trainer-cpu"
    res = run_sync(cfg, tr, ReferenceRollout(cfg), capture=DigestFirst(), probes=True)
    assert not [f for f in res.findings if f.verdict != "pass"], [(f.invariant_id, f.message) for f in res.findings
                                                                   if f.verdict != "pass"]
    with pytest.raises(LookupError, match="current step"):
        tr.export_hf_at(1)
