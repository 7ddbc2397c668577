"""An exclusion that differs per side: the trainer quantizes a fused GEMM whole (Megatron-Core's GDN in_proj
[q|k|v|z|b|a], one Transformer Engine GEMM) while the engine serves some members in BF16 (SkyRL's Qwen3.5 choice:
vLLM keeps in_proj_a / in_proj_b BF16). It is one SyncConfig; both sides' sets are derived there; it is judged (X3
at configuration time, S6 first after a sync), never refused with a traceback."""
import json

import pytest
import torch

from fp8check.harness.config import SyncConfig, recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.models import get_model
from fp8check.harness.integrations.check import SyncCheckFailed
from fp8check.harness.integrations.pytest_plugin import SyncChecker
from fp8check.harness.sync.pipeline import run_sync
from fp8check.invariants import REGISTRY, CheckContext, run_invariant

SPLIT = ("linear_attn.in_proj_a", "linear_attn.in_proj_b")
L0 = get_model("tiny-hybrid").layer_prefix(0)            # model.language_model.layers.0. (the served wrapper's names)
B, A = L0 + "linear_attn.in_proj_b.weight", L0 + "linear_attn.in_proj_a.weight"
IN_PROJ = "decoder.layers.0.self_attention.in_proj.weight"


def split_config(recipe="blockwise-fp32", model="tiny-hybrid"):
    extra = ("mlp.gate", "mlp.shared_expert_gate") if model == "tiny-hybrid-moe" else ()
    return recommended_config(model, recipe, default_exclude=False, exclude=SPLIT + extra)


@pytest.mark.parametrize("recipe", ["blockwise-fp32", "blockwise-pow2", "mxfp8"])
def test_both_sides_derived_from_one_config(recipe):
    cfg = split_config(recipe)
    assert cfg.split_tensors == {B, A}
    assert cfg.trainer_splits == {IN_PROJ: (B, A)}
    assert {B, A} <= cfg.trainer_fp8_tensors and not {B, A} & cfg.fp8_tensors
    assert {B, A} & cfg.high_precision == {B, A} and not {B, A} & cfg.engine_fp8_tensors
    assert {L0 + "linear_attn.in_proj_a", L0 + "linear_attn.in_proj_b"} <= set(cfg.ignored_layers)
    closed = recommended_config("tiny-hybrid", recipe)          # the model's own set: the whole in_proj excluded
    assert not closed.split_tensors and closed.trainer_fp8_tensors == closed.fp8_tensors


def test_the_trainer_exports_the_split_members_with_their_block_row_scale():
    """In checkpoint names b and a read the scale of the block row of the fused in_proj they lie in (rows 1536..1543
    of [1544, 512]: block row 12): read straight off the learner's Megatron-named bytes."""
    cfg = split_config()
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    meg, hf = t.fp8_forward_weights(), t.export_hf()
    codes, scale = meg[IN_PROJ], meg[IN_PROJ + "_scale_inv"]
    assert tuple(codes.shape) == (1544, 512) and codes.dtype == torch.float8_e4m3fn
    for name, row0 in ((B, 1536), (A, 1540)):
        assert torch.equal(hf[name].view(torch.uint8), codes[row0:row0 + 4].view(torch.uint8))
        assert torch.equal(hf[name + "_scale_inv"], scale[12:13])


def test_preflight_judges_the_split_config_x3_names_the_gemm_and_members():
    cfg = split_config()
    fs = [f for f in run_invariant(REGISTRY["X3"], CheckContext(cfg)) if f.verdict == "fail"]
    assert [f.tensor for f in fs] == [IN_PROJ]
    assert "in_proj_qkv | in_proj_z | in_proj_b | in_proj_a" in fs[0].message
    assert L0 + "linear_attn.in_proj_b" in fs[0].message


@pytest.mark.parametrize("model,recipe", [("tiny-hybrid", "blockwise-fp32"), ("tiny-hybrid-moe", "mxfp8")])
def test_a_sync_of_the_split_config_fails_only_the_split_first(model, recipe):
    """fp8check's own sync of it: the trainer's codes everywhere the engine holds FP8, the trainer's values in BF16
    for b and a. Every check holds but the split itself (X3, S6); S6's one finding is at stage config."""
    cfg = split_config(recipe, model)
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    res = run_sync(cfg, t, make_engine("rollout", "cpu-reference", cfg), probes=True)
    bad = [f for f in res.findings if f.verdict != "pass"]
    assert sorted((f.invariant_id, f.tensor) for f in bad) == [("S6", IN_PROJ), ("X3", IN_PROJ)]
    s6 = next(f for f in bad if f.invariant_id == "S6")
    assert s6.evidence["stage"] == "config" and s6.evidence["members"] == [B, A]


def test_a_user_sync_of_the_split_config_puts_s6_first():
    """The plugin's report: S6 names the split first. A member sent as FP8 where the engine serves BF16 is then the
    wire's (S5/S6 at stage wire), not hidden behind the split."""
    cfg = split_config()
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()

    def sync(weights, masters, load):
        load([(n, masters[n] if n in cfg.split_tensors else w) for n, w in weights.items()
              if not (n.endswith("_scale_inv") and n[: -len("_scale_inv")] in cfg.split_tensors)])

    with pytest.raises(SyncCheckFailed) as e:
        SyncChecker(cfg, t, make_engine("rollout", "cpu-reference", cfg))(sync)
    fails = [f for f in e.value.findings if f.verdict == "fail"]
    assert [(f.invariant_id, f.tensor) for f in fails] == [("S6", IN_PROJ)]

    def fp8_members(weights, masters, load):
        load(list(weights.items()))

    with pytest.raises(SyncCheckFailed) as e:
        SyncChecker(cfg, t, make_engine("rollout", "cpu-reference", cfg))(fp8_members)
    fails = [f for f in e.value.findings if f.verdict == "fail"]
    assert (fails[0].invariant_id, fails[0].tensor) == ("S6", IN_PROJ)
    assert {(f.invariant_id, f.tensor) for f in fails if f.evidence.get("stage") == "wire"} >= {("S5", B), ("S6", A)}


def test_skyrl_job_on_a_qwen35_model_is_judged_by_skyrl_spec(tmp_path, capsys, monkeypatch):
    """Pre-flight on a SkyRL job with a Qwen3.5 model: the exclusion is what SkyRL's FP8 spec keeps in BF16 (GDN
    in_proj_a / in_proj_b), so X3 reports the split of the fused in_proj; the model's own set (the whole in_proj)
    would have held."""
    import fp8check.harness.jobconfig as jobconfig
    from fp8check.harness.cli import main
    monkeypatch.setattr(jobconfig, "detect_gpu", lambda: None)
    for k in ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0"):
        monkeypatch.delenv(k, raising=False)
    argv = ["preflight", "examples/skyrl_hopper_fp8.yaml", "--gpu", "sm90", "--json",
            "--set", "trainer.policy.model.path=tiny-hybrid"]
    main(argv)
    rep = json.loads(capsys.readouterr().out)
    x3 = [ln for ln in rep["lines"] if ln["rule"] == "X3"]
    assert [ln["level"] for ln in x3] == ["error"]
    assert "[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]" in x3[0]["why"]
    assert L0 + "linear_attn.in_proj_a" in x3[0]["why"]
    assert x3[0]["value"].startswith("SkyRL 0.4.0's FP8 spec for qwen3_5_text")
    main(argv[:-2] + ["--set", "trainer.policy.model.path=tiny-dense"])          # no spec: the model's own set
    rep = json.loads(capsys.readouterr().out)
    assert not [ln for ln in rep["lines"] if ln["rule"] == "X3" and ln["level"] != "ok"]


def test_the_split_config_round_trips_as_data():
    cfg = split_config("mxfp8")
    again = SyncConfig.from_dict(cfg.to_dict())
    assert again.split_tensors == cfg.split_tensors and again.ignored_layers == cfg.ignored_layers
