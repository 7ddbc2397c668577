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


# -- UNKNOWN and empty are never PASS: check_sync, the plugin, the verdict of no findings, ids ------------------------
def _installed():
    from fp8check.harness.engines.registry import make_engine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    eng = make_engine("rollout", "cpu-reference", cfg)
    sent = dict(trainer.export_hf())
    eng.install([(k, t, 1) for k, t in sent.items()], 1)
    return cfg, trainer, eng, sent


def test_no_finding_at_all_is_unknown():
    from fp8check.invariants import overall
    assert overall([]) == "unknown"


def test_check_sync_fails_on_unknown_unless_the_caller_accepts_it():
    from fp8check.harness.integrations.check import SyncCheckFailed, check_sync
    cfg, _, eng, sent = _installed()
    with pytest.raises(SyncCheckFailed) as e:          # no version given: S7 cannot decide which one is served
        check_sync(eng, sent, cfg)
    assert not [f for f in e.value.findings if f.verdict == "fail"]
    assert str(e.value).startswith("no violation, 2 undecided (UNKNOWN: S7)"), str(e.value)
    accepted = check_sync(eng, sent, cfg, allow_unknown=True)
    assert {f.verdict for f in accepted} == {"pass", "unknown"}


def test_an_invariant_id_not_in_the_catalog_is_refused_naming_the_nearest():
    """The review's case: `ids=["s3"]` on a doubled block scale returned [] (the id dropped, nothing run)."""
    from fp8check.harness.errors import BadInput
    from fp8check.harness.integrations.check import SyncCheckFailed, check_sync
    cfg, _, eng, sent = _installed()
    sn = "model.layers.0.mlp.down_proj.weight_scale_inv"
    doubled = {**sent, sn: sent[sn] * 2}
    eng.install([(sn, doubled[sn], 1)], 1)
    with pytest.raises(BadInput) as e:
        check_sync(eng, doubled, cfg, ids=["s3"], version=1)
    assert str(e.value).startswith("unknown invariant id 's3': not in the catalog; nearest: S3, ")
    with pytest.raises(SyncCheckFailed):
        check_sync(eng, sent, cfg, ids=["S3"], version=1)


def test_the_plugin_fails_on_unknown_unless_accepted():
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.integrations.check import SyncCheckFailed
    from fp8check.harness.integrations.pytest_plugin import SyncChecker
    cfg, trainer, _, _ = _installed()
    checker = SyncChecker(cfg, trainer, make_engine("rollout", "cpu-reference", cfg))

    def sync(w, m, load):
        load(list(w.items()))
    with pytest.raises(SyncCheckFailed) as e:          # R4 named: no sleep / wake cycle to judge
        checker(sync, ids=["R4"])
    assert [f.verdict for f in e.value.findings] == ["unknown"]
    assert [f.verdict for f in checker(sync, ids=["R4"], allow_unknown=True)] == ["unknown"]


PLUGIN_USER_TEST = '''
def test_scales_left_out(fp8check_sync):
    fp8check_sync(lambda w, m, load: load([(k, v) for k, v in w.items() if not k.endswith("_scale_inv")]))


def test_nothing_to_judge(fp8check_sync):
    fp8check_sync(lambda w, m, load: load(list(w.items())), ids=["R4"])
'''


def test_the_plugins_failure_shows_the_findings_not_its_source(tmp_path):
    """A user's failing test shows its own line and then the findings, root first: not the plugin's frames (about
    50 lines of its source). `--fp8check-allow-unknown` accepts an UNKNOWN for the session."""
    import os
    import subprocess
    import sys
    (tmp_path / "test_user.py").write_text(PLUGIN_USER_TEST)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fp8check-allow-unknown",
                        str(tmp_path / "test_user.py")], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": root})
    out = p.stdout
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "eng.poison()" not in out and "def __call__" not in out, out
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(">") and "fp8check_sync(" in ln)
    assert lines[at + 1].startswith("E       fp8check.harness.integrations.check.SyncCheckFailed: ")
    assert lines[at + 2].strip().startswith("E") and "S1 model.layers.0." in lines[at + 2], lines[at:at + 4]


def test_preflight_counts_rules_of_another_stack_apart_from_those_that_hold(capsys):
    """examples/skyrl_hopper_fp8.yaml is a SkyRL job: verl's V1-V5 and NeMo RL's N1-N13 have nothing to judge in
    it; they are not applicable (saying why), never among the rules that hold."""
    import json
    from fp8check.harness.cli import main
    other = {f"V{i}" for i in range(1, 6)} | {f"N{i}" for i in range(1, 14)}
    main(["preflight", "examples/skyrl_hopper_fp8.yaml", "--gpu", "sm90", "--json"])
    rep = json.loads(capsys.readouterr().out)
    na = {ln["rule"]: ln["why"] for ln in rep["lines"] if ln["level"] == "n/a"}
    assert set(na) == other and rep["not_applicable"] == len(other), sorted(na)
    assert all("this job's keys are skyrl's" in why for why in na.values())
    assert not other & {ln["rule"] for ln in rep["lines"] if ln["level"] == "ok"}
    main(["preflight", "examples/skyrl_hopper_fp8.yaml", "--gpu", "sm90"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"{rep['hold']} rule(s) hold, 18 not applicable to this job" in last, last
