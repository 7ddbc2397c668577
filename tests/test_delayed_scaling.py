"""Transformer Engine's per-tensor delayed scaling as the CPU learner runs it (harness.formats.delayed, the
seeds' naive trainer: Megatron-Core `fp8_recipe="delayed"`). Expected values are written out from TE's rule
(common/recipe/delayed_scaling.cu, the cast kernels), not taken from the code under test; the byte-exactness
against TE itself is tests/gpu/test_te_delayed_conformance.py."""
from dataclasses import replace

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.formats.delayed import FLT_MAX, DelayedScaling

E4M3 = torch.float8_e4m3fn


def _sat(x: torch.Tensor) -> torch.Tensor:
    return x.float().clamp(-448, 448).to(E4M3)


def test_the_first_cast_runs_at_scale_one_and_records_the_amax():
    st = DelayedScaling().state()
    w = torch.tensor([[0.01, -0.5], [3.0, 1000.0]], dtype=torch.bfloat16)
    codes, s_inv = st.cast(w)
    assert torch.equal(codes.view(torch.uint8), _sat(w).view(torch.uint8))        # 1000 saturates to 448
    assert s_inv.tolist() == [1.0] and st.amax_history.tolist() == [1000.0]


def test_most_recent_update_is_448_over_the_amax_and_zeroes_the_history():
    st, rec = DelayedScaling().state(), DelayedScaling()
    w = torch.tensor([0.25, -3.0], dtype=torch.bfloat16)
    st.cast(w)
    st.update(rec)
    assert st.scale.tolist() == [torch.tensor(448.0, dtype=torch.float32).div(3.0).item()]
    assert st.amax_history.tolist() == [0.0]
    # the next cast uses that scale: the delayed step (codes of a grown weight saturate)
    codes, s_inv = st.cast(w * 2)
    assert torch.equal(codes.view(torch.uint8), _sat((w * 2).float() * st.scale).view(torch.uint8))
    assert s_inv.tolist() == [torch.reciprocal(st.scale).item()]
    assert codes.view(torch.uint8)[1].item() & 0x7F == 0x7E                       # -6 * 448/3 -> -448


def test_max_over_a_window_rolls_the_newest_amax_last():
    rec = DelayedScaling(margin=1, amax_history_len=3, amax_compute_algo="max")
    st = rec.state()
    for a in (2.0, 8.0, 4.0):
        st.cast(torch.tensor([a]))
        st.update(rec)
    # after three updates the history holds [0, 8, 4] (slot 0 zeroed, slot i <- slot i+1, newest last) and the
    # scale is 448 * 2^-1 / max(window)
    assert st.amax_history.tolist() == [0.0, 8.0, 4.0]
    assert st.scale.tolist() == [224.0 / 8.0]


def test_no_amax_keeps_the_scale_and_the_history():
    rec = DelayedScaling(amax_history_len=2, amax_compute_algo="max")
    st = rec.state()
    st.cast(torch.tensor([2.0]))
    st.update(rec)
    before = (st.scale.clone(), st.amax_history.clone())
    st.update(rec)                                        # nothing recorded since: no roll, same scale
    assert torch.equal(st.scale, before[0]) and torch.equal(st.amax_history, before[1])


@pytest.mark.parametrize("amax,want", [(float("inf"), 1.0), (float("nan"), 1.0), (1e-40, FLT_MAX)])
def test_non_finite_amax_keeps_the_scale_and_a_tiny_one_gives_flt_max(amax, want):
    rec = DelayedScaling()
    st = rec.state()
    st.amax_history[0] = amax
    st.update(rec)
    assert st.scale.tolist() == [want]


def test_reading_the_learners_fp8_weights_does_not_move_its_state():
    base = recommended_config("tiny-rl", "blockwise-fp32")
    cfg = replace(base, rollout=replace(base.rollout, quantization="online-per-tensor"),
                  trainer=replace(base.trainer, precision="fp8-delayed"))
    learner = make_engine("trainer", "cpu-learner", cfg)
    k = next(iter(learner.weight_states))
    before = learner.weight_states[k].amax_history.clone()
    learner.export_hf(), learner.logprobs([[1, 2, 3, 4]])
    assert torch.equal(learner.weight_states[k].amax_history, before)


def test_the_learners_codes_are_one_step_late():
    """After an RL step the learner's FP8 weight is the new master cast with the scale from the previous master's
    amax (Megatron casts each weight once per step; the update runs at the autocast exit)."""
    from fp8check.e2e.rl.loss import SFTLoss
    from fp8check.e2e.rl.task import DigitTask
    base = recommended_config("tiny-rl", "blockwise-fp32")
    cfg = replace(base, rollout=replace(base.rollout, quantization="online-per-tensor"),
                  trainer=replace(base.trainer, precision="fp8-delayed"))
    learner = make_engine("trainer", "cpu-learner", cfg)
    task = DigitTask("copy", 4)
    k = "decoder.layers.0.mlp.linear_fc2.weight"
    old = learner.masters[k].detach().to(torch.bfloat16).float()
    learner.train_step(task.supervised(task.prompts(8, 0)), SFTLoss())
    new = learner.masters[k].detach().to(torch.bfloat16).float()
    scale = torch.tensor(448.0) / old.abs().max()
    codes = learner.fp8_forward_weights()[k]
    assert torch.equal(codes.view(torch.uint8), _sat(new * scale).view(torch.uint8))
    assert learner.fp8_forward_weights()[k + "_scale_inv"].tolist() == [torch.reciprocal(scale).item()]
