"""The live session (one pipeline, digest-first capture, faults, checks, probes and their per-sync bounds) with the CPU
reference engines behind the same remote wrapper, in this process (the wire encoding is exercised, Ray is not).
Not a live test: the GPU suite (tests/gpu) runs the same session against real vLLM and Megatron-Core/TE."""
import pytest

from fp8check import faults
from fp8check.e2e.live import LiveSession
from fp8check.faults import live_faults
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.cpu.perturbed import PerturbableRollout

CPU = dict(trainer="cpu-reference", rollout="cpu-reference", ray=False)
DENSE_LIVE = live_faults(recommended_config("tiny-dense", "blockwise-fp32"), PerturbableRollout.knobs)


def cpu_session(cfg):
    return LiveSession(cfg, **CPU)


@pytest.fixture(scope="module")
def session():
    with cpu_session(recommended_config("tiny-dense", "blockwise-fp32")) as s:
        s.step()
        yield s


def test_clean_sync_green_and_digest_first_moves_nothing(session):
    o = session.sync("clean", probes=True)
    assert not o.fired and not o.unknown, o.to_json()
    assert o.fetched == 0 and o.params == 27
    p1 = next(f for f in o.findings if f.invariant_id == "P1")
    assert p1.verdict == "pass" and o.extra["probe_floor"] is not None, p1
    # the bound comes from the reference forward of the trainer's own bytes, not from this sync's measurement
    assert o.extra["probe_bounds"]["mean_abs_dlogprob"] >= 0.05
    assert session.probe_bounds is None, "nothing is calibrated from a sync: the bounds are derived per sync"


def test_p1_fails_on_a_policy_the_byte_checks_cannot_see(session):
    """Every byte right, the sampler's logits scaled (log-probs at temperature 0.8): P1 is the only catch."""
    o = session.sync("temperature", fault=faults.FAULTS["logprobs_at_sampling_temperature"])
    assert o.fired == ["P1"], o.to_json()
    p1 = next(f for f in o.findings if f.invariant_id == "P1" and f.verdict == "fail")
    assert "exceeds" in p1.message and p1.evidence["floor"] is not None
    again = session.sync("again", probes=True)
    assert not again.fired and not again.unknown, again.to_json()


@pytest.mark.parametrize("name", DENSE_LIVE)
def test_live_injectable_fault_is_caught(session, name):
    f = faults.FAULTS[name]
    if f.destructive:                      # a fresh engine: the damage may outlive the fault
        with cpu_session(session.config) as s:
            s.step()
            o, again = s.sync(name, fault=f), s.sync("again")
    else:
        o, again = session.sync(name, fault=f), session.sync("again")
    assert f.verdict(o.fired) == "caught", (name, o.fired, f.trips)
    assert not f.undeclared(o.fired), (name, o.fired, f.declared)
    if f.destructive and again.fired:      # not repaired: the checks keep saying so (never green on a broken engine)
        assert {"S1", "S2"} & set(again.fired), again.to_json()
    else:
        assert not again.fired and not again.unknown, (name, again.to_json())


def test_live_fault_list_is_derived_from_the_registry():
    """One source: every payload / trainer / bucket fault and every knob fault the engine supports, destructive
    ones last; config faults and faults that need another engine never."""
    assert DENSE_LIVE.index("tensor_duplicated") > DENSE_LIVE.index("scale_x2_block")
    flags = [faults.FAULTS[n].destructive for n in DENSE_LIVE]
    assert flags == sorted(flags) and flags[-1], "destructive faults form the tail of the live order"
    assert "prefix_cache_not_reset" not in DENSE_LIVE          # only a cold-vs-warm differential sees it
    for n in ("postprocess_skipped", "generation_during_sync", "norm_quantized_in_trainer", "bucket_lost"):
        assert n in DENSE_LIVE
    for n in ("fp32_scales_through_e8m0", "tp_shards_swapped", "linear_bf16_in_engine_only", "mxfp8_on_hopper"):
        assert n not in DENSE_LIVE


def test_naive_sync_is_caught_while_the_probe_stays_quiet(session):
    o = session.sync("naive", naive=True, probes=True)
    assert {"S2", "S3", "S4"} & set(o.fired)
    assert "P1" not in o.fired, "the point: log-probs alone do not see this"


def test_direct_load_weights_path_mirrors_vllm_and_is_flagged(session):
    """model.load_weights after startup: real vLLM 0.26 on the H200 (tests/gpu) refused at the
    first FP8 linear, wrote the 2 tensors before it, and left 25 of 27 parameters poisoned; S1 and S7 fired.
    The reference must do the same, and a reload must recover."""
    o = session.sync("direct", direct=True)
    assert {"S1", "S7"} <= set(o.fired), o.to_json()
    assert o.fetched == 25 and o.params == 27 and "load_weights" in o.engine_error
    again = session.sync("again")
    assert not again.fired and not again.unknown


def test_run_live_report_and_rendering(tmp_path, capsys):
    """The `fp8check live` report and its rendering, over the CPU stand-ins."""
    import argparse
    import json

    from fp8check.e2e.live import run_live
    from fp8check.harness.cli.live import render
    cfg = recommended_config("tiny-moe", "blockwise-fp32")
    with cpu_session(cfg) as s:
        rep = run_live(cfg, 2, ["experts_permuted", "postprocess_twice"], session=s)
    assert [s["label"] for s in rep["syncs"]][:2] == ["step 1", "step 2"]
    assert all(f["verdict"] == "caught" for f in rep["faults"]), rep["faults"]
    args = argparse.Namespace(out=str(tmp_path / "live.json"), json=False)
    assert render(rep, cfg, args, str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "live fault injection" in out and "experts_permuted" in out
    assert json.load(open(tmp_path / "live.json"))["faults"][0]["fault"] == "experts_permuted"


def test_live_snapshot_verifies_elsewhere_and_tampering_is_caught(tmp_path):
    """`fp8check live --snapshot DIR`: the last clean sync, read back in full from the engine, verifies green
    with `fp8check verify`; one flipped scale in the captured engine state turns it red (S3)."""
    from fp8check.e2e.live import run_live
    from fp8check.harness.cli.snapshot import verify_dir
    from fp8check.harness.snapshot import read_snapshot_dir, write_snapshot_dir
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    out = tmp_path / "snap"
    rep = run_live(cfg, 1, ["scale_x2_block"], snapshot_dir=str(out), **CPU)
    assert "27 engine parameters" in rep["snapshot"]
    assert verify_dir(str(out), as_json=True) == 0
    snap = read_snapshot_dir(str(out))
    rollout = {n: snap.rollout[n].clone() for n in snap.rollout.names()}
    name = next(n for n in rollout if n.endswith("qkv_proj.weight_scale_inv"))
    rollout[name].view(-1)[0] *= 2
    from fp8check.harness.snapshot import Snapshot
    write_snapshot_dir(str(out), snap.manifest, rollout=Snapshot("rollout", rollout, snap.rollout.meta))
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert verify_dir(str(out), as_json=True) == 1
    assert '"S3"' in buf.getvalue()


def test_live_without_gpu_is_one_line_exit_2():
    import subprocess
    import sys

    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: `fp8check live` would start real engines")
    p = subprocess.run([sys.executable, "-m", "fp8check", "live", "--model", "tiny-dense"], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "GPU" in p.stderr
