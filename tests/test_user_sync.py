"""A user's own sync judged as the wire it is: what the user's function hands `load` (the pytest plugin) and what
`check_sync` is told the job sent are checked like fp8check's own payload (S1 coverage, S5 dtypes, S6
exclusions, S2/S3 at stage `wire`), and the findings come root first: the first line names the tensor and the
disagreement. Buckets arrive as one update (vLLM 0.26's start / update-per-bucket / finish)."""
import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import SyncCheckFailed, check_sync, root_first
from fp8check.harness.integrations.pytest_plugin import SyncChecker


def _checker(model="tiny-dense", recipe="blockwise-fp32"):
    cfg = recommended_config(model, recipe)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    return cfg, SyncChecker(cfg, trainer, make_engine("rollout", "cpu-reference", cfg))


def _send(weights, load, bucket=4, edit=None):
    items = list(weights.items())
    if edit:
        items = edit(items)
    for i in range(0, len(items), bucket):
        load(items[i:i + bucket])


def _fails(e):
    return [f for f in e.value.findings if f.verdict == "fail"]


def test_the_learners_bytes_in_any_bucketing_are_clean():
    cfg, checker = _checker()
    for bucket in (1, 3, 1000):
        findings = checker(lambda w, m, load: _send(w, load, bucket))
        assert not [f for f in findings if f.verdict != "pass"], [(f.invariant_id, f.message) for f in findings
                                                                  if f.verdict != "pass"]


def test_bf16_sent_for_an_fp8_weight_is_named_first_as_a_dtype_disagreement():
    cfg, checker = _checker()
    n = "model.layers.1.mlp.down_proj.weight"

    def bf16_for_fp8(items):          # the master's BF16 instead of the learner's codes, and no scale
        return [(k, cfg.recipe.dequantize_weight(t, dict(items)[k + "_scale_inv"]).bfloat16() if k == n else t)
                for k, t in items if k != n + "_scale_inv"]
    with pytest.raises(SyncCheckFailed) as e:
        checker(lambda w, m, load: _send(w, load, edit=bf16_for_fp8))
    first = _fails(e)[0]
    assert (first.invariant_id, first.tensor) == ("S5", n)
    assert first.message.startswith("sent bfloat16") and "the engine holds FP8" in first.message
    assert str(e.value).splitlines()[1].strip().startswith(f"S5 {n}: sent bfloat16")
    # the consequences are there too, after the root
    assert {"S1", "S6"} <= {f.invariant_id for f in _fails(e)}


def test_fp8_and_scale_sent_for_a_router_the_engine_keeps_bf16_is_an_exclusion_disagreement():
    cfg, checker = _checker("tiny-moe")
    n = "model.layers.0.mlp.gate.weight"
    assert n in cfg.high_precision

    def quantized_router(items):
        out = []
        for k, t in items:
            if k == n:
                q, s = cfg.recipe.quantize_weight(t.float())
                out += [(k, q), (k + "_scale_inv", s)]
            else:
                out.append((k, t))
        return out
    with pytest.raises(SyncCheckFailed) as e:
        checker(lambda w, m, load: _send(w, load, edit=quantized_router))
    wire = [f for f in _fails(e) if f.evidence.get("stage") == "wire"]
    assert _fails(e)[0].evidence.get("stage") == "wire" and _fails(e)[0].tensor == n
    s6 = [f for f in wire if f.invariant_id == "S6"]
    assert [f.message for f in s6] == ["sent as FP8 + scale_inv, config declares high precision; the engine keeps BF16"]
    s5 = [f.message for f in wire if f.invariant_id == "S5" and f.tensor == n]
    assert s5 == ["sent float8_e4m3fn, declared bfloat16; the engine holds BF16"]
    # the engine refused the FP8 bytes for its BF16 router (no FP8 block grid fits it): after the wire's findings
    refusal = next(i for i, f in enumerate(_fails(e)) if f.message.startswith("update did not complete"))
    assert all(f.evidence.get("stage") == "wire" for f in _fails(e)[:refusal])


def test_a_tensor_sent_again_in_a_later_bucket_is_caught_on_the_wire_and_in_the_engine():
    cfg, checker = _checker()
    n = "model.layers.0.self_attn.o_proj.weight"
    with pytest.raises(SyncCheckFailed) as e:
        checker(lambda w, m, load: (_send(w, load), load([(n, w[n])])))
    s1 = {(f.evidence.get("stage"), f.tensor, f.message) for f in _fails(e) if f.invariant_id == "S1"}
    assert ("wire", n, "sent 2 times (must be exactly once)") in s1
    assert any(stage == "engine" and t == n for stage, t, _ in s1)         # the late load was dropped


def test_a_sync_that_raises_midway_leaves_a_finalized_engine_judged_as_left():
    cfg, checker = _checker()

    def half_then_crash(w, m, load):
        items = list(w.items())
        load(items[: len(items) // 2])
        raise RuntimeError("NCCL timeout")
    with pytest.raises(SyncCheckFailed) as e:
        checker(half_then_crash)
    fails = _fails(e)
    assert fails[0].invariant_id == "S7" and "the sync function raised RuntimeError: NCCL timeout" in fails[0].message
    # the buckets that never came: on the wire (not sent) and in the engine (finalized without them)
    assert any(f.invariant_id == "S1" and f.evidence.get("stage") == "wire" for f in fails)
    assert any(f.invariant_id == "S2" and f.evidence.get("stage") == "engine" for f in fails)


def test_check_sync_judges_expected_as_the_wire_root_first():
    """check_sync on an engine fp8check drives (the protocol path): `expected` holds BF16 where FP8 is declared,
    and the engine got exactly that."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    eng = make_engine("rollout", "cpu-reference", cfg)
    n = "model.layers.0.self_attn.q_proj.weight"
    sent = dict(trainer.export_hf())
    sent[n] = cfg.recipe.dequantize_weight(sent[n], sent.pop(n + "_scale_inv")).bfloat16()
    eng.install([(k, t, 1) for k, t in sent.items()], 1)
    findings = check_sync(eng, sent, cfg, on_fail="return", version=1)
    first = next(f for f in findings if f.verdict == "fail")
    assert (first.invariant_id, first.tensor) == ("S5", n) and "the engine holds FP8" in first.message


def test_root_first_is_a_stable_order_by_stage_then_dtype_and_exclusion_first():
    from fp8check.invariants.base import fail, passed
    fs = [passed("S1", "ok"), fail("S2", "a", "x", stage="engine"), fail("S1", "b", "y", stage="wire"),
          fail("S6", "c", "z", stage="wire"), fail("S7", None, "update did not complete: boom"),
          fail("S4", "d", "w", stage="trainer")]
    fs.append(fail("S7", None, "update did not complete: RuntimeError: the sync function raised KeyError: 'x'"))
    assert [(f.invariant_id, f.tensor, f.message[:30]) for f in root_first(fs)] == [
        ("S7", None, "update did not complete: Runti"), ("S6", "c", "z"), ("S1", "b", "y"),
        ("S7", None, "update did not complete: boom"), ("S4", "d", "w"), ("S2", "a", "x"), ("S1", None, "ok")]


def test_megatron_names_reach_the_users_function_with_te_padded_scales():
    """names="megatron": what the learner holds -- Megatron names, fp32 masters, TE's padded scale layout."""
    from fp8check.harness.formats.te_layout import wire_to_te
    cfg, checker = _checker()
    weights, masters = checker.inputs("megatron")
    n = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert weights[n].dtype == torch.float8_e4m3fn and tuple(weights[n].shape) == (1536, 512)
    fwd = checker.trainer.fp8_forward_weights()
    assert torch.equal(weights[n + "_scale_inv"], wire_to_te(fwd[n + "_scale_inv"]))
    assert masters[n].dtype == torch.float32 and "model.embed_tokens.weight" not in weights
    with pytest.raises(ValueError, match="names must be 'hf' or 'megatron'"):
        checker.inputs("vllm")
