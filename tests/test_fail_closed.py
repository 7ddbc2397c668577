"""Checks that cannot pass without looking: a differential that compares fewer prompts than were asked (R3), a
KV-cache scale the engine did not report (R1), FP8 tensors C1 could not reach -- each is a failure or UNKNOWN
naming what was not judged, never a PASS."""
import copy
from dataclasses import replace

import pytest

from fp8check.harness.config import recommended_config
from fp8check.harness.record import KVScale, Outputs
from fp8check.harness.snapshot import Snapshot
from fp8check.harness.sync.pipeline import reference_sync
from fp8check.invariants import run_catalog


@pytest.fixture(scope="module")
def synced():
    return reference_sync(recommended_config("tiny-dense", "blockwise-fp32"), checks=False)[0]


def _with_outputs(snap, greedy, logprobs):
    meta = copy.deepcopy(snap.meta)
    meta.serving.outputs = Outputs(greedy=greedy, prompt_logprobs=logprobs)
    return Snapshot(snap.role, snap.tensors, meta, snap.specs, snap.proof)


def _r3(res, warm, cold):
    ctx = res.context()
    ctx.rollout, ctx.cold = _with_outputs(res.rollout, *warm), _with_outputs(res.rollout, *cold)
    return run_catalog(ctx, ids=["R3"])


def test_r3_fails_when_the_warm_engine_answers_fewer_prompts(synced):
    greedy, lp = [[5, 6, 7], [8, 9, 10], [11, 12, 13]], [[-1.0, -2.0], [-1.5, -2.5], [-0.5, -0.25]]
    (same,) = _r3(synced, (greedy, lp), (greedy, lp))
    assert same.verdict == "pass", same
    fewer = _r3(synced, (greedy[:2], lp[:2]), (greedy, lp))          # what it answered agrees, one prompt is gone
    assert {f.verdict for f in fewer} == {"fail"}, fewer
    assert {f.message for f in fewer} == {"the warm engine answered 2 prompts (greedy), a fresh engine 3",
                                          "the warm engine answered 2 prompts (prompt_logprobs), a fresh engine 3"}


def test_r1_names_a_kv_scale_the_engine_did_not_report():
    base = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(base, rollout=replace(base.rollout, kv_cache_dtype="fp8_e4m3"))
    res = reference_sync(cfg, checks=False)[0]
    assert {f.verdict for f in run_catalog(res.context(), ids=["R1"])} == {"pass"}
    sv = res.rollout.meta.serving
    layer = sorted(sv.kv_scales)[0]
    sv.kv_scales[layer] = KVScale(None, *(getattr(sv.kv_scales[layer], w) for w in ("v", "q", "prob")))
    (f,) = run_catalog(res.context(), ids=["R1"])
    assert f.verdict == "unknown" and f.tensor == f"{layer}._k_scale", f
    assert f.message == "k scale after the sync: the engine reported none, the config declares 1.0"


def test_c1_names_every_fp8_tensor_it_could_not_check(synced):
    cfg = synced.config
    fp8 = sorted(cfg.trainer_fp8_tensors)
    master = {n: t for n, t in synced.master.tensors.items() if n != fp8[0]}
    trainer = {n: t for n, t in synced.trainer.tensors.items() if n not in (fp8[1], fp8[2] + "_scale_inv")}
    ctx = synced.context()
    ctx.master, ctx.trainer = Snapshot("master", master), Snapshot("trainer", trainer, synced.trainer.meta)
    got = {(f.verdict, f.tensor, f.message) for f in run_catalog(ctx, ids=["C1"])}
    assert got == {("unknown", fp8[0], "not checked: the master snapshot lacks it"),
                   ("unknown", fp8[1], "not checked: the trainer snapshot lacks it"),
                   ("unknown", fp8[2] + "_scale_inv",
                    f"scale not checked: the trainer snapshot lacks {fp8[2]}_scale_inv")}, got
