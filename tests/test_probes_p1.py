"""P1 honest: it fails on non-finite metrics (naming them), its bound comes from the reference forward of a perfect
sync's engine (never from the measurement it judges), and a probe the engine cannot serve is unknown."""
import math

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.protocol import EngineError
from fp8check.harness.sync.pipeline import reference_engines, reference_sync, run_sync
from fp8check.invariants import CheckContext, run_catalog
from fp8check.invariants.probes import ProbeRun, prompts_for


@pytest.fixture(scope="module")
def clean():
    return reference_sync(recommended_config("tiny-dense", "blockwise-fp32"), probes=True)[0]


def _p1(res, run):
    ctx = CheckContext(res.config, res.payload, res.trainer, res.rollout, res.master, run)
    return run_catalog(ctx, ids=["P1"])


def test_a_clean_sync_passes_with_a_bound_from_the_floor(clean):
    (f,) = _p1(clean, clean.probe_run)
    assert f.verdict == "pass", f
    floor, bounds = f.evidence["floor"], f.evidence["bounds"]
    assert floor is not None and bounds["mean_abs_dlogprob"] == max(0.05, 2.5 * floor["mean_abs_dlogprob"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_probe_fails_and_names_the_metric(clean, bad):
    run = clean.probe_run
    broken = ProbeRun(run.prompts, run.trainer, [torch.full_like(x, bad) for x in run.rollout])
    (f,) = _p1(clean, broken)
    assert f.verdict == "fail" and "mean_abs_dlogprob" in f.message and "not finite" in f.message, f


def test_the_bound_does_not_move_with_the_measurement(clean):
    """Scaling the sampler's log-probs moves the metrics, never the bound (it is computed from the trainer's bytes)."""
    run = clean.probe_run
    (a,) = _p1(clean, run)
    moved = _p1(clean, ProbeRun(run.prompts, run.trainer, [x * 1.5 for x in run.rollout]))
    assert a.verdict == "pass" and moved and all(f.verdict == "fail" for f in moved), moved
    assert all(f.evidence["bounds"] == a.evidence["bounds"] for f in moved)


def test_a_learner_whose_log_probs_are_off_fails_as_the_learner(clean):
    """The review's case: the learner's measured log-probs x1.6 passed P1, its floor scored against that very
    measurement (mean |dlogprob| 5.05 against a bound of 12.6). The bound now comes from the reference forwards of
    the trainer's bytes and of a perfect sync's engine, which no engine measured: the same bound as a correct sync,
    and the learner named as the side that is off."""
    run = clean.probe_run
    (ok,) = _p1(clean, run)
    assert ok.verdict == "pass" and ok.evidence["learner"]["mean_abs_dlogprob"] <= 1e-5, ok
    off = _p1(clean, ProbeRun(run.prompts, [x * 1.6 for x in run.trainer], run.rollout))
    assert off and {f.verdict for f in off} == {"fail"}, off
    assert all(f.evidence["bounds"] == ok.evidence["bounds"] for f in off)
    learner = [f for f in off if f.message.endswith("against the reference forward of its own bytes")]
    assert {f.message.split(" = ")[0] for f in learner} == {"mean_abs_dlogprob", "mult_prob_error_median", "kl"}
    assert not [f for f in off if "sampler's log-probs against the reference" in f.message]
    # x1.6 on log-probs near log(1/vocab): |dlogprob| ~ 0.6 x |logprob|, two orders past the field's 0.05
    want = float(torch.cat([x.double() for x in run.trainer]).abs().mean()) * 0.6
    assert off[0].evidence["learner"]["mean_abs_dlogprob"] == pytest.approx(want, rel=1e-6)


def test_an_engine_that_cannot_serve_the_probe_is_unknown_not_a_crash():
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer, rollout = reference_engines(cfg)
    trainer.optimizer_step()

    def refuse(prompts):
        raise EngineError("NotImplementedError: Cannot copy out of meta tensor; no data!")
    rollout.generate_logprobs = refuse
    res = run_sync(cfg, trainer, rollout, probes=True)
    (f,) = [x for x in res.findings if x.invariant_id == "P1"]
    assert f.verdict == "unknown" and "meta tensor" in f.message, f


def test_the_probe_prompts_fold_into_a_small_vocabulary():
    """tiny-rl has 128 tokens: the probe (and `fp8check live --model tiny-rl`) must not index past it."""
    res = reference_sync(recommended_config("tiny-rl", "blockwise-fp32"), probes=True)[0]
    assert all(t < 128 for p in res.probe_run.prompts for t in p)
    assert all(math.isfinite(v) for v in res.probes.values() if isinstance(v, float))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_bound_fails_closed(clean, bad):
    """Bounds fixed before the run (or a floor the trainer's own bytes make non-finite) never let a probe pass."""
    ctx = CheckContext(clean.config, clean.payload, clean.trainer, clean.rollout, clean.master, clean.probe_run,
                       {"mean_abs_dlogprob": bad, "mult_prob_error_median": 1.1, "kl": 0.01})
    (f,) = run_catalog(ctx, ids=["P1"])
    assert f.verdict == "fail" and "not finite" in f.message, f


@pytest.mark.parametrize("lengths", ["one", "distinct"])
def test_the_probe_forward_holds_one_layer_of_dequantized_weights_at_a_time(lengths):
    """P1's reference forward runs layer-major through a one-layer window: every weight is made once per forward
    (not once per prompt), a layer's values are released before the next layer's are made, and the log-probs are
    the per-prompt forward's. Prompts of distinct lengths run one a batch, the per-prompt GEMMs: bit for bit.
    Prompts of one length run as one [B, T] batch, whose GEMMs have B x T rows: the BLAS may sum a row in another
    order at another row count (an AVX512 CPU does at 36 x 512 @ 512 x 512, 4.8e-7 apart in the log-probs; the
    earlier sessions' CPUs gave equal bits), so that case holds to float32's rounding, not to the bit."""
    import gc
    import weakref
    from fp8check.harness.lazy import LazyMap
    from fp8check.harness.numerics.forward import Weights, prompts_logprobs
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    g = torch.Generator().manual_seed(0)
    base = {t.name: torch.randn(t.shape, generator=g) * 0.05 for t in cfg.spec.tensors()}
    made, live = [], {}

    def make(n):
        layer = n.split(".")[2] if n.startswith("model.layers.") else None
        gc.collect()
        for other, ref in live.items():            # every earlier layer's values are gone by now
            if layer is not None and other[0] is not None and other[0] != layer:
                assert ref() is None, f"{other[1]} still held while the forward reads {n}"
        v = base[n].clone()
        made.append(n)
        live[(layer, n)] = weakref.ref(v)
        return v

    prompts = prompts_for(cfg.spec.vocab_size)
    if lengths == "distinct":
        prompts = [p[:len(p) - i] for i, p in enumerate(prompts)]
    assert len(prompts) > 1 and len({len(p) for p in prompts}) == (1 if lengths == "one" else len(prompts))
    lazy = Weights(LazyMap(list(base), make), frozenset(), None)
    got = prompts_logprobs(cfg.spec, lazy, prompts, layer_major=True)
    layer_names = [n for n in base if n.startswith("model.layers.")]
    assert sorted(n for n in made if n in layer_names) == sorted(layer_names)     # each made once, not per prompt
    want = prompts_logprobs(cfg.spec, Weights(base, frozenset(), None), prompts)
    assert [a.shape for a in got] == [b.shape for b in want]
    if lengths == "distinct":
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    else:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("side", ["trainer", "rollout"])
def test_a_weight_that_cannot_be_dequantized_when_read_is_unknown_naming_it(side):
    """The forward dequantizes when it reads a weight: a scale that does not fit its codes fails there, and P1 is
    unknown naming the weight (as the eager read was), never a crash and never a pass. The trainer's case fails
    at the read; the rollout's earlier, where the scale does not map back to checkpoint coordinates."""
    from fp8check.harness.snapshot import Snapshot
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    res, _, _ = reference_sync(cfg, steps=1, checks=False)
    ctx = res.context(None)
    snap = getattr(ctx, side)
    ts = dict(snap.tensors)
    k = next(n for n in ts if n.endswith("o_proj.weight_scale_inv"))
    ts[k] = ts[k].reshape(-1)[:1].clone()
    setattr(ctx, side, Snapshot(side, ts, snap.meta))
    (f,) = run_catalog(ctx, ids=["P1"])
    assert f.verdict == "unknown"
    assert f"the {side} snapshot lacks {k.removesuffix('_scale_inv')}" in f.message


def _p1_forwards(monkeypatch, cfg, capture, fault=None):
    """The P1 finding of a reference sync captured with `capture`, and how many reference forwards P1 ran."""
    import fp8check.harness.numerics.forward as fw
    res = reference_sync(cfg, capture=capture, fault=fault, checks=False)[0]
    calls, real = [], fw.prompts_logprobs
    monkeypatch.setattr(fw, "prompts_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    (f,) = run_catalog(res.context(), ids=["P1"])
    monkeypatch.setattr(fw, "prompts_logprobs", real)
    return f, len(calls)


@pytest.mark.parametrize("recipe", ["blockwise-fp32", "blockwise-pow2"])
def test_a_digest_first_capture_runs_the_floor_once_for_the_rollout_too(monkeypatch, recipe):
    """Every digest matched: the rollout snapshot is the capture's expected state, so its forward is the floor's
    (two forwards, not three) and P1 says exactly what it says over a full read of the engine."""
    from fp8check.harness.sync.capture import DigestFirst, FullRead
    cfg = recommended_config("tiny-dense", recipe)
    full, n_full = _p1_forwards(monkeypatch, cfg, FullRead())
    dig, n_dig = _p1_forwards(monkeypatch, cfg, DigestFirst())
    assert (n_full, n_dig) == (3, 2)
    assert dig.verdict == full.verdict == "pass" and dig.message == full.message
    assert dig.evidence["metrics"] == full.evidence["metrics"] and dig.evidence["floor"] == full.evidence["floor"]


def test_an_engine_that_holds_other_bytes_gets_its_own_forward(monkeypatch):
    from fp8check.faults import FAULTS
    from fp8check.harness.sync.capture import DigestFirst, FullRead
    from fp8check.harness.sync.pipeline import fault_config
    fault = FAULTS["scale_nan_block"]
    cfg = fault_config(recommended_config("tiny-dense", "blockwise-fp32"), fault)
    full, _ = _p1_forwards(monkeypatch, cfg, FullRead(), fault)
    dig, n_dig = _p1_forwards(monkeypatch, cfg, DigestFirst(), fault)
    assert n_dig == 3 and dig.verdict == full.verdict == "fail" and dig.message == full.message


def _fp8_kv_engine_logprobs(cfg, rollout, prompts, scale, logit_scale=1.0):
    """What an engine with an FP8 KV cache computes for the rollout's weights: K (after RoPE) and V stored as E4M3
    at `scale` (x / scale, nearest even, saturating at 448) and read back times `scale`: vLLM's cache write and its
    Triton attention's read, written out here apart from fp8check's own rule."""
    from dataclasses import replace
    from fp8check.harness.numerics.forward import prompts_logprobs

    def cache(t, prefix, which):
        return (t.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    w = replace(rollout.hf_weights(), kv_quant=cache, logit_scale=logit_scale)
    return prompts_logprobs(cfg.spec, w, prompts)


@pytest.mark.parametrize("scale", [1.0, 0.003])
def test_a_perfect_engine_with_an_fp8_kv_cache_passes_and_the_floor_must_model_it(scale, monkeypatch):
    """An engine whose only difference from the learner is its FP8 KV cache (what the H200's serving phase loop
    runs: fp8_e4m3 at scale 1) passes P1: the floor's reference forward reads K and V back from the same cache. A
    floor that leaves the cache out (as it did) fails the same engine; an engine off in another way still fails."""
    from dataclasses import replace
    import fp8check.invariants.probes as probes
    base = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(base, rollout=replace(base.rollout, kv_cache_dtype="fp8_e4m3", kv_scale=scale))
    res, _, rollout = reference_sync(cfg, probes=True)
    prompts = res.probe_run.prompts
    engine = ProbeRun(prompts, res.probe_run.trainer, _fp8_kv_engine_logprobs(cfg, rollout, prompts, scale))
    (f,) = _p1(res, engine)
    assert f.verdict == "pass", f
    off = ProbeRun(prompts, res.probe_run.trainer, _fp8_kv_engine_logprobs(cfg, rollout, prompts, scale, 1.5))
    assert {x.verdict for x in _p1(res, off)} == {"fail"}
    monkeypatch.setattr(probes, "_engine_kv", lambda ctx: None)           # the floor without the KV cache
    assert {x.verdict for x in _p1(res, engine)} == {"fail"}


def test_an_fp8_kv_round_trip_is_e4m3_at_the_scale_saturating():
    from fp8check.harness.numerics.kv_cache import fp8_kv_cache
    q = fp8_kv_cache(lambda prefix, which: 2.0)
    x = torch.tensor([0.6, 1000.0, -1000.0, 0.0, float("inf"), float("nan")])
    got = q(x, "model.layers.0.", "k")
    # 0.6 / 2 = 0.3 -> 0.3125 (1.010b x 2^-2, the nearer E4M3), x 2; 1000 / 2 and inf saturate at 448 (satfinite),
    # x 2; NaN stays NaN (P1 then fails on non-finite log-probs)
    assert got[:5].tolist() == [0.625, 896.0, -896.0, 0.0, 896.0] and math.isnan(got[5])


def test_calibrated_kv_scales_missing_from_the_trainer_are_named():
    from dataclasses import replace
    from fp8check.harness.numerics.kv_cache import declared_kv_cache
    base = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(base, rollout=replace(base.rollout, kv_cache_dtype="fp8_e4m3", kv_scales="calibrated"))
    assert declared_kv_cache(cfg, {}) == "the trainer declares no model.layers.0.self_attn.k_scale (calibrated " \
                                         "KV-cache scales)"
    assert declared_kv_cache(base) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_floor_fails_p1_never_the_field_bound(clean, bad, monkeypatch):
    """A reference the engine's declared numerics make non-finite (here a KV-cache scale of NaN or inf) gives a
    non-finite bound, which P1 fails on: `max(field, NaN)` is the field bound, which a finite probe passed."""
    import fp8check.invariants.probes as probes
    from fp8check.harness.numerics.kv_cache import fp8_kv_cache
    from fp8check.invariants.probes import calibrated_bounds
    assert all(v != v for v in calibrated_bounds({k: float("nan") for k in probes.BOUNDS}).values())
    monkeypatch.setattr(probes, "_engine_kv", lambda ctx: fp8_kv_cache(lambda prefix, which: bad))
    (f,) = _p1(clean, clean.probe_run)
    assert f.verdict == "fail" and "reference bound" in f.message and "not finite" in f.message, f
