"""An engine that quantizes the BF16 it receives per tensor, as vLLM 0.26's `quantization="fp8"` does on a BF16
checkpoint (config rollout.quantization=online-per-tensor; TRL's and SkyRL's naive FP8 rollout): one fp32 scale
amax / 448 per *fused* parameter and rank (q|k|v share one, gate|up one, each routed expert one), codes
e4m3(x * (1 / scale)). The expectations below are computed from that rule directly, not through fp8check's
functions; the CPU reference engine in its online mode is the engine."""
from dataclasses import replace

import pytest
import torch

from fp8check.harness.config import ConfigError, recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import check_sync
from fp8check.harness.numerics.online import online_engine_state_hf, scaled_fp8_quant_per_tensor

from online_engines import bf16_masters, fails, online_config, stale_sync_failures, synced


def _cfg(model="tiny-dense", tp=1):
    return online_config("online-per-tensor", model, tp)



def _vllm_rule(x: torch.Tensor):
    """vLLM's dynamic per-tensor quant, from its kernel (common.cu / common.cuh), written out here."""
    s = x.float().abs().max() / 448.0
    return (x.float() * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn), s


@pytest.mark.parametrize("model,tp", [("tiny-dense", 1), ("tiny-moe", 1), ("tiny-hybrid", 1), ("tiny-dense", 2),
                                      ("tiny-moe", 2)])
def test_a_correct_bf16_sync_into_a_per_tensor_engine_is_clean(model, tp):
    cfg = _cfg(model, tp)
    eng, findings = synced(cfg, bf16_masters(cfg))
    assert not fails(findings), [(f.invariant_id, f.tensor, f.message) for f in fails(findings)]
    assert {f.invariant_id for f in findings if f.verdict == "pass"} >= {"S1", "S2", "S3", "S4", "S5", "S6", "C10"}
    assert eng.record().act_quant == "vllm-per-token"


def test_q_k_v_share_the_fused_parameters_one_scale():
    cfg = _cfg()
    sent = bf16_masters(cfg)
    hf = online_engine_state_hf(cfg, sent)
    s = "model.layers.0.self_attn."
    fused = torch.cat([sent[s + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])
    q, sc = _vllm_rule(fused)
    nq = sent[s + "q_proj.weight"].shape[0]
    nk = sent[s + "k_proj.weight"].shape[0]
    assert torch.equal(hf[s + "k_proj.weight"].view(torch.uint8), q[nq:nq + nk].view(torch.uint8))
    for p in ("q_proj", "k_proj", "v_proj"):
        assert hf[s + p + ".weight_scale_inv"].tolist() == [float(sc)]
    # the fused scale is not k's own: quantizing k alone would give other codes
    assert float(sent[s + "k_proj.weight"].float().abs().max() / 448.0) != float(sc)


def test_each_routed_expert_has_its_own_scale_over_gate_and_up():
    cfg = _cfg("tiny-moe")
    sent = bf16_masters(cfg)
    hf = online_engine_state_hf(cfg, sent)
    e = "model.layers.0.mlp.experts.3."
    _, sc = _vllm_rule(torch.cat([sent[e + "gate_proj.weight"], sent[e + "up_proj.weight"]]))
    assert hf[e + "gate_proj.weight_scale_inv"].tolist() == [float(sc)] == hf[e + "up_proj.weight_scale_inv"].tolist()
    _, s2 = _vllm_rule(sent[e + "down_proj.weight"])
    assert hf[e + "down_proj.weight_scale_inv"].tolist() == [float(s2)]


def test_tensor_parallel_ranks_quantize_their_own_shards():
    cfg = _cfg(tp=2)
    sent = bf16_masters(cfg)
    hf = online_engine_state_hf(cfg, sent)
    n = "model.layers.0.self_attn.o_proj.weight"               # row-parallel: split along K
    w = sent[n]
    k = w.shape[1] // 2
    want = [float(_vllm_rule(w[:, :k])[1]), float(_vllm_rule(w[:, k:])[1])]
    assert hf[n + "_scale_inv"].tolist() == want and want[0] != want[1]


def test_an_all_zero_tensor_saturates_as_the_kernel_does():
    """scale 0: x * (1 / 0) is 0 * inf = NaN, and the kernel's fminf / fmaxf drop the NaN: every code is 448."""
    q, s = scaled_fp8_quant_per_tensor(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert float(s) == 0.0 and set(q.view(torch.uint8).flatten().tolist()) == {0x7E}


def test_a_stale_tensor_is_caught_by_name():
    cfg = _cfg()
    n = "model.layers.1.mlp.down_proj.weight"
    failed = stale_sync_failures(cfg, n)
    assert {f.tensor for f in failed if f.invariant_id == "S2"} == {n}
    assert {f.tensor for f in failed if f.invariant_id == "S3"} == {n + "_scale_inv"}


def test_an_engine_quantizing_per_block_is_not_a_per_tensor_engine():
    """The same BF16 sync into an engine that quantizes 128x128 blocks, judged as the per-tensor config says:
    every FP8 tensor's scale is not what that rule makes (S3), so the disagreement cannot pass unseen."""
    cfg = _cfg()
    sent = bf16_masters(cfg)
    other = replace(cfg, rollout=replace(cfg.rollout, quantization="online-per-block"))
    eng = make_engine("rollout", "cpu-reference", other)
    eng.install([(n, t, 1) for n, t in sent.items()], 1)
    fired = {f.invariant_id for f in fails(check_sync(eng, sent, cfg, on_fail="return", version=1))}
    assert {"S3", "S4"} <= fired


def test_bad_engine_and_trainer_settings_are_one_line_config_errors():
    base = recommended_config("tiny-dense", "blockwise-fp32")
    with pytest.raises(ConfigError, match="fp8-delayed .* has no on-policy checkpoint sync"):
        replace(base, trainer=replace(base.trainer, precision="fp8-delayed"))
    with pytest.raises(ConfigError, match="trainer.precision=bf16 has no FP8 bytes"):
        replace(base, trainer=replace(base.trainer, precision="bf16"))
    with pytest.raises(ConfigError, match="trainer.precision: 'fp16' is not one of"):
        replace(base, trainer=replace(base.trainer, precision="fp16"))
    with pytest.raises(ConfigError, match="amax_compute_algo must be one of"):
        replace(base, rollout=replace(base.rollout, quantization="online-per-tensor"),
                trainer=replace(base.trainer, precision="fp8-delayed", amax_compute_algo="mean"))
