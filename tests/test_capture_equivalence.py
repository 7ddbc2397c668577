"""A digest-first capture changes what the checks read, never what they find: for every fault in the registry (and
a clean sync) on the reference engines, the catalog's findings -- verdicts, tensors, messages and evidence -- after
a `DigestFirst` capture are those after a `FullRead` one. DigestFirst represents the parameters its digests prove
by what a correct sync leaves there, made only where read, and the checks compare those in checkpoint coordinates
as the trainer's own tensors (`CheckContext.rollout_hf`): this is what makes that shortcut safe to take."""
import json

import pytest
import torch

from fp8check.faults import FAULTS, NoTarget
from fp8check.harness.config import recommended_config
from fp8check.harness.errors import ConfigError
from fp8check.harness.engines.protocol import EngineError
from fp8check.harness.layouts import LayoutError
from fp8check.harness.sync.capture import DigestFirst, FullRead
from fp8check.harness.sync.pipeline import fault_config, reference_sync

# what a cell may end in besides findings: the injector found no target (it says so), or a misconfiguration the
# engines cannot be built from (the matrix's "sync impossible": config-stage faults only); anything else is a bug
_EXPECTED = (NoTarget, LayoutError, EngineError, ConfigError)


def _expected(fault, e) -> str:
    if not isinstance(e, NoTarget) and (fault is None or fault.stage != "config"):
        raise e
    return f"{e.__class__.__name__}: {e}"


CELLS = [(None, "tiny-dense", "blockwise-fp32"), (None, "tiny-moe", "blockwise-pow2")] + [
    (name, "tiny-dense", "blockwise-fp32") for name in sorted(FAULTS)] + [
    (name, "tiny-moe", "blockwise-pow2") for name in sorted(FAULTS) if FAULTS[name].stage in ("payload", "engine")]


def _findings(fault, model, recipe, capture):
    base = recommended_config(model, recipe)
    if fault is not None and not fault.applies(base):
        return None
    cfg = fault_config(base, fault)
    steps = 2 if fault is not None and fault.stage == "serving" else 1
    try:
        res, _, _ = reference_sync(cfg, fault=fault, steps=steps, probes=True, capture=capture)
    except _EXPECTED as e:
        return _expected(fault, e)
    # as text: a NaN metric in the evidence is equal to itself there
    return res, [json.dumps(f.to_json(), sort_keys=True, default=str) for f in res.findings]


@pytest.mark.parametrize("name,model,recipe", CELLS, ids=[f"{n or 'clean'}-{m}-{r}" for n, m, r in CELLS])
def test_digest_first_finds_what_a_full_read_finds(name, model, recipe):
    fault = FAULTS[name] if name else None
    full = _findings(fault, model, recipe, FullRead())
    first = _findings(fault, model, recipe, DigestFirst())
    if full is None or isinstance(full, str):
        assert first == full
        return
    (_, want), (res, got) = full, first
    assert got == want
    proof = res.rollout.proof
    assert proof is not None and set(proof.matched) | set(res.mismatching) == set(res.rollout.names()) | \
        set(res.rollout.meta.unmaterialized) | set(res.mismatching)
    if fault is None:                     # a clean sync proves every parameter: nothing is fetched
        assert res.fetched == 0 and set(proof.matched) == set(res.rollout.names())


def test_trainer_bytes_that_look_poisoned_are_reported_alike():
    """An element of all 0xFF bytes in what the trainer sends (a NaN pattern) lands in the engine, which then looks
    like a poisoned destination no sync wrote: a full read reports it under S1, and a digest-first capture, which
    reads nothing, must too (its digests' pass screens the expected bytes for the pattern)."""
    from types import SimpleNamespace

    def apply(config, hf, ctx):
        name = "model.layers.0.mlp.down_proj.weight"
        t = hf[name].clone()
        t.view(torch.uint8)[3, 5] = 0xFF
        return {**hf, name: t}
    import torch
    fault = SimpleNamespace(name="ff_in_trainer", stage="trainer", params={}, apply=apply, knobs=None,
                            setup=lambda c: c)
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    full, _, _ = reference_sync(cfg, fault=fault, capture=FullRead())
    first, _, _ = reference_sync(cfg, fault=fault, capture=DigestFirst())
    assert first.rollout.proof.sentinel == ["model.layers.0.mlp.down_proj.weight"]
    s1 = [f for f in first.findings if f.invariant_id == "S1" and f.verdict == "fail"]
    assert [f.tensor for f in s1] == ["model.layers.0.mlp.down_proj.weight"]
    text = lambda fs: [json.dumps(f.to_json(), sort_keys=True, default=str) for f in fs]   # noqa: E731
    assert text(first.findings) == text(full.findings)


BACKGROUND = [(None, False), (None, True)] + [
    (name, False) for name in sorted(FAULTS) if FAULTS[name].stage in ("trainer", "payload", "buckets", "engine")]


@pytest.mark.parametrize("name,e8m0", BACKGROUND, ids=[f"{n or 'clean'}{'-e8m0' if e else ''}" for n, e in BACKGROUND])
def test_expected_digests_begun_before_the_install_find_the_same(name, e8m0, monkeypatch):
    """The expected digests start before the install (`DigestFirst.begin`, in a thread on the GPU path: here on the
    CPU through the same thread) with no transform; the capture keeps them where the engine's declared transform
    leaves a parameter alone and recomputes the rest (vLLM's UE8M0 requantization: every FP8 weight). Same
    findings as a full read, and the begun digests used."""
    from dataclasses import replace
    fault = FAULTS[name] if name else None
    base = recommended_config("tiny-dense", "blockwise-fp32")
    if e8m0:
        base = replace(base, rollout=replace(base.rollout, deep_gemm_e8m0=True))
        assert base.requant_ue8m0
    results = []
    for capture in (FullRead(), DigestFirst()):
        if fault is not None and not fault.applies(base):
            pytest.skip(f"{name} does not apply")
        cfg = fault_config(base, fault)
        try:
            res, _, _ = reference_sync(cfg, fault=fault, probes=True, capture=capture, ahead_on_cpu=True)
        except _EXPECTED as e:
            results.append((None, _expected(fault, e)))
            continue
        results.append((res, [json.dumps(f.to_json(), sort_keys=True, default=str) for f in res.findings]))
    (_, want), (res, got) = results
    assert got == want
    if res is not None:
        assert "capture.expected_ahead" in res.seconds
        if fault is None:                     # every parameter proven by its digest: nothing fetched
            assert res.fetched == 0
        if e8m0:                              # the transform's parameters were recomputed, the others kept
            assert res.rollout.meta.post_load.kind == "ue8m0_requant" and res.rollout.meta.post_load.params


def test_expected_digests_that_fail_before_the_install_are_computed_in_the_capture(monkeypatch):
    """A failure of the digests begun before the install (a kernel error, out of memory in the thread) costs time,
    never a finding: the capture derives every expected digest itself, and a clean sync still proves everything."""
    from fp8check.harness.sync import capture as capture_mod

    def broken(self, stream=None):
        raise RuntimeError("CUDA out of memory (injected)")
    monkeypatch.setattr(capture_mod._Ahead, "_run", broken)
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    full, _, _ = reference_sync(cfg, probes=True, capture=FullRead(), ahead_on_cpu=True)
    first, _, _ = reference_sync(cfg, probes=True, capture=DigestFirst(), ahead_on_cpu=True)
    text = lambda fs: [json.dumps(f.to_json(), sort_keys=True, default=str) for f in fs]   # noqa: E731
    assert text(first.findings) == text(full.findings) and not first.fired and first.fetched == 0
    assert "capture.expected_ahead" not in first.seconds


def _trainer_scale_fault(name: str, write):
    """A learner whose own bytes break S3's encoding rules (no registered fault writes the trainer's scales: theirs
    break the wire's or the engine's), so that the screens begun beside the install have something to find."""
    from types import SimpleNamespace

    def apply(config, hf, ctx):
        w = "model.layers.1.mlp.up_proj.weight"
        codes, scale = hf[w].clone(), hf[w + "_scale_inv"].clone()
        write(codes, scale)
        return {**hf, w: codes, w + "_scale_inv": scale}
    return SimpleNamespace(name=name, stage="trainer", params={}, apply=apply, knobs=None, setup=lambda c: c,
                           applies=lambda c: True)


def _zero_block(codes, scale):
    codes[:128, :128] = 0                                    # an all-zero block whose scale_inv is not 1 (TE's rule)
    scale[0, 0] = 0.5


TRAINER_SCALE_FAULTS = {
    "nonpositive": _trainer_scale_fault("nonpositive", lambda c, s: s.view(-1)[:1].fill_(-1.0)),
    "not_pow2": _trainer_scale_fault("not_pow2", lambda c, s: s.view(-1)[:1].fill_(0.3)),
    "zero_block": _trainer_scale_fault("zero_block", _zero_block),
    "e8m0_nan": _trainer_scale_fault("e8m0_nan", lambda c, s: s.view(torch.uint8).view(-1)[:1].fill_(0xFF)),
}
SCREENS = [(None, "tiny-dense", r) for r in ("blockwise-fp32", "blockwise-pow2", "mxfp8")] + [
    (name, "tiny-dense", "blockwise-fp32") for name in sorted(FAULTS) if "S3" in FAULTS[name].trips] + [
    (name, "tiny-dense", "blockwise-pow2") for name in sorted(FAULTS) if "S3" in FAULTS[name].trips] + [
    ("nonpositive", "tiny-dense", "blockwise-fp32"), ("not_pow2", "tiny-dense", "blockwise-pow2"),
    ("zero_block", "tiny-dense", "blockwise-fp32"), ("e8m0_nan", "tiny-dense", "mxfp8")]


@pytest.mark.parametrize("name,model,recipe", SCREENS, ids=[f"{n or 'clean'}-{r}" for n, _, r in SCREENS])
def test_the_trainer_screens_begun_beside_the_install_find_the_same(name, model, recipe, monkeypatch):
    """S3's screens of the trainer's own tensors (its scales' encodings, TE's zero-block rule) begin beside the
    install on the GPU path (`invariants.screens.trainer_screens`; here on the CPU through the same thread): the same
    findings as S3 screening every tensor itself, and S3 read no trainer scale again."""
    import fp8check.invariants.screens as iscreens
    fault = (TRAINER_SCALE_FAULTS.get(name) or FAULTS[name]) if name else None
    base = recommended_config(model, recipe)
    if fault is not None and not fault.applies(base):
        pytest.skip(f"{name} does not apply")
    cfg = fault_config(base, fault)
    screened = []
    real = iscreens.segment_flags
    monkeypatch.setattr(iscreens, "segment_flags", lambda tensors, masks, mode=None: screened.append(len(tensors)) or
                        real(tensors, masks, mode))
    results = []
    for ahead in (False, True):
        screened.clear()
        try:
            res, _, _ = reference_sync(cfg, fault=fault, probes=True, capture=DigestFirst(), ahead_on_cpu=ahead)
        except _EXPECTED as e:
            results.append((None, _expected(fault, e), []))
            continue
        results.append((res, [json.dumps(f.to_json(), sort_keys=True, default=str) for f in res.findings],
                        list(screened)))
    (_, want, alone), (res, got, beside) = results
    assert got == want
    if res is not None:
        assert isinstance(res.screens, iscreens.TrainerScreens)
        # alone: S3's one concatenation holds every trainer scale; beside: the thread's did, S3's holds the rest
        assert beside[-1] < alone[-1] or alone[-1] == 0, (alone, beside)
        if name in TRAINER_SCALE_FAULTS:                  # what the screens found, S3 reports on the learner's bytes
            assert any(f.invariant_id == "S3" and f.verdict == "fail" and f.evidence.get("stage") == "trainer"
                       for f in res.findings), name


def test_the_trainer_screens_begin_only_where_s3_runs():
    """S3 is their one reader: a sync checking other invariants only (a live fault's own ids) begins none."""
    import fp8check.invariants.screens as iscreens
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    assert isinstance(reference_sync(cfg, capture=DigestFirst(), check_ids=["S3"], ahead_on_cpu=True)[0].screens,
                      iscreens.TrainerScreens)
    assert reference_sync(cfg, capture=DigestFirst(), check_ids=["S1", "S2"], ahead_on_cpu=True)[0].screens is None


def test_a_trainer_tensor_written_after_its_screen_is_screened_again():
    """The screens are taken only for the very tensor object at the version they read, under the sync's own config:
    a scale written in place afterwards (a non-positive scale_inv) is screened by S3 itself, and fires."""
    import fp8check.invariants.screens as iscreens
    from fp8check.invariants import run_catalog
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    res, _, _ = reference_sync(cfg, probes=False, capture=DigestFirst())
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"
    t = res.trainer.tensors[name] = res.trainer.tensors[name].clone()    # the export is shared: write a copy
    screens = iscreens.trainer_screens(res.config, res.trainer.tensors)
    assert screens.encodings_of(t)[0] is False                   # finite and positive
    t.view(-1)[0] = -1.0                                          # in place: the version counter moves

    def s3(screens):
        ctx = res.context()
        ctx.screens = screens
        return [f for f in run_catalog(ctx, ids=["S3"], periodic=False) if f.verdict == "fail"
                and f.tensor == name and "non-positive" in f.message and f.evidence.get("stage") == "trainer"]
    assert s3(screens) and s3(None)
    # a screen that says "clean" for the tensor as it is now is taken under the sync's config (the guard is what
    # decides), and not under another config object
    lying = iscreens.TrainerScreens(res.config, {id(t): (t, t._version, [False, False])}, {})
    assert not s3(lying)
    lying.config = recommended_config("tiny-dense", "blockwise-fp32")
    assert s3(lying)


def test_work_begun_inside_ahead_held_starts_when_the_block_ends(monkeypatch):
    from fp8check.harness.sync import capture as capture_mod
    """The pipeline hands the background thread its work inside `ahead_held()` and the work starts as the block
    ends, so the thread never holds the interpreter while the pipeline makes its next hand-off; the work and its
    result are as if started at once, and an error inside the block still opens the gate."""
    import threading
    import time as _time
    started = threading.Event()
    hf = {"w": torch.zeros(2)}
    with capture_mod.ahead_held():
        first = capture_mod.start_ahead(lambda: (started.set(), 1)[1], hf, on_cpu=True)
        second = capture_mod.start_ahead(lambda: 2, hf, on_cpu=True)
        _time.sleep(0.05)
        assert not started.is_set()                     # held until the block ends
    assert (first.result(timeout=10), second.result(timeout=10)) == (1, 2) and started.is_set()
    with pytest.raises(RuntimeError):
        with capture_mod.ahead_held():
            third = capture_mod.start_ahead(lambda: 3, hf, on_cpu=True)
            raise RuntimeError("a hand-off failed")
    assert third.result(timeout=10) == 3
