"""check_sync on an engine that quantizes BF16 itself with vLLM's `fp8_per_block` (config
rollout.quantization=online-per-block, vLLM's online block method for BF16 training + FP8 rollout): the engine is
judged against vLLM's per-block rule applied to what was sent (harness.numerics.online.online_engine_state_hf:
each fused parameter quantized whole), with the CPU reference engine in its online mode as the engine."""
from dataclasses import replace

import pytest
import torch

from fp8check.harness.config import ConfigError, recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import check_sync
from fp8check.harness.numerics.online import online_engine_state_hf, per_block_cast_to_fp8

from online_engines import bf16_masters, fails, online_config, stale_sync_failures, synced


def _online(model="tiny-dense"):
    return online_config("online-per-block", model)



@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe", "tiny-hybrid"])
def test_a_correct_bf16_sync_into_an_online_engine_is_clean(model):
    cfg = _online(model)
    _, findings = synced(cfg, bf16_masters(cfg))
    assert not fails(findings), [(f.invariant_id, f.tensor, f.message) for f in fails(findings)]
    assert {f.invariant_id for f in findings if f.verdict == "pass"} >= {"S1", "S2", "S3", "S4", "S5", "S6", "C10"}


def test_the_expected_state_is_the_fused_parameter_quantized_whole():
    """q|k|v quantized as one [3*512, 512] parameter, cut back: on tiny-dense the shards are whole blocks, so it
    equals quantizing each checkpoint tensor -- computed here directly from vLLM's rule."""
    cfg = _online()
    sent = bf16_masters(cfg)
    hf = online_engine_state_hf(cfg, sent)
    s = "model.layers.0.self_attn."
    fused = torch.cat([sent[s + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")]).float()
    q, sc = per_block_cast_to_fp8(fused)
    assert torch.equal(hf[s + "k_proj.weight"].view(torch.uint8), q[512:1024].view(torch.uint8))
    assert torch.equal(hf[s + "k_proj.weight_scale_inv"], sc[4:8])
    assert hf["model.norm.weight"].dtype == torch.bfloat16


def test_a_stale_tensor_in_the_sync_is_caught_by_name():
    cfg = _online()
    n = "model.layers.1.mlp.up_proj.weight"
    failed = stale_sync_failures(cfg, n)
    assert {f.invariant_id for f in failed} >= {"S2", "S4"} and {f.tensor for f in failed if f.invariant_id == "S2"} == {n}


def test_fp8_sent_into_an_online_engine_is_a_dtype_disagreement_on_the_wire():
    cfg = _online()
    sent = bf16_masters(cfg)
    n = "model.layers.0.self_attn.o_proj.weight"
    q, s = cfg.recipe.quantize_weight(sent[n].float())
    wire = {**sent, n: q, n + "_scale_inv": s}
    eng = make_engine("rollout", "cpu-reference", cfg)
    try:
        eng.install([(k, t, 1) for k, t in wire.items()], 1)
    except Exception:  # noqa: BLE001 - the engine may refuse; it is judged as left
        pass
    first = fails(check_sync(eng, wire, cfg, on_fail="return", version=1))[0]
    assert (first.invariant_id, first.tensor) == ("S5", n) and first.message.startswith("sent float8_e4m3fn")


def test_online_per_block_needs_blockwise_fp32():
    base = recommended_config("tiny-dense", "blockwise-pow2")
    with pytest.raises(ConfigError, match="online-per-block quantizes 128x128 blocks with FP32 scales"):
        replace(base, rollout=replace(base.rollout, quantization="online-per-block"))
    with pytest.raises(ConfigError, match="rollout.quantization: 'fp8_per_tensor' is not one of"):
        replace(base, rollout=replace(base.rollout, quantization="fp8_per_tensor"))


def test_an_all_zero_block_follows_vllms_floor_not_tes_rule():
    """vLLM's per-block rule floors amax at 1e-4 (a zero block gets scale_inv 1e-4 / 448); TE's gives 1. A BF16
    weight with a zero block, synced correctly into an online engine, is clean."""
    cfg = _online()
    sent = bf16_masters(cfg)
    n = "model.layers.0.mlp.down_proj.weight"
    sent[n] = sent[n].clone()
    sent[n][:128, :128] = 0
    eng = make_engine("rollout", "cpu-reference", cfg)
    eng.install([(k, t, 1) for k, t in sent.items()], 1)
    assert float(online_engine_state_hf(cfg, sent)[n + "_scale_inv"][0, 0]) == pytest.approx(1e-4 / 448)
    failed = fails(check_sync(eng, sent, cfg, on_fail="return", version=1))
    assert not failed, [(f.invariant_id, f.tensor, f.message) for f in failed]
