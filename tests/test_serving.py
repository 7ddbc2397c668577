"""The engine as RL stacks run it, on the CPU reference: the serving checks (R1 KV scales, R2 graph-visible storage,
R3 cold-vs-warm differential, R4 wake) hold through a phase loop with sleep levels 1 and 2, and each serving fault
is caught at the first sync or wake after it. Not live: tests/gpu/test_serving.py runs the same loop on vLLM."""
from dataclasses import replace

import pytest

from fp8check.e2e.serving import SERVING_FAULTS, loop_ok, phase_loop
from fp8check.harness.config import recommended_config
from fp8check.harness.sync.pipeline import reference_sync
from fp8check.invariants import REGISTRY


def serving_config(**kw):
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    return replace(cfg, rollout=replace(cfg.rollout, **{"kv_cache_dtype": "fp8_e4m3", "cuda_graphs": True,
                                                          "sleep_mode": True, **kw}))


@pytest.mark.slow
def test_phase_loop_holds_and_catches_every_serving_fault():
    rep = phase_loop(serving_config(), steps=2, trainer="cpu-reference", rollout="cpu-reference", ray=False)
    assert loop_ok(rep), rep
    assert {f["fault"] for f in rep["faults"] if f["verdict"] == "caught"} == set(SERVING_FAULTS)
    assert [p["phase"] for p in rep["phases"]][:3] == ["boot", "sync step 1", "wake level 1"]
    # every probed sync's P1 margin is on record, passing ones too (the floor reads K and V back from FP8)
    probed = [p for p in rep["phases"] if p["phase"].startswith("sync step")]
    assert probed and all(p["probe"]["metrics"]["kl"] <= p["probe"]["bounds"]["kl"] for p in probed), probed


def test_serving_checks_apply_only_where_the_config_serves_that_way():
    res, _, _ = reference_sync(recommended_config("tiny-dense", "blockwise-fp32"))
    ran = {f.invariant_id for f in res.findings}
    assert not ran & {"R1", "R2", "R3", "R4"}
    res, _, _ = reference_sync(serving_config(sleep_mode=False))
    ran = {f.invariant_id: f.verdict for f in res.findings}
    assert ran["R1"] == "pass" and ran["R2"] == "pass" and "R4" not in ran


def test_unpinned_dummy_kv_scale_is_caught():
    """vLLM's dummy boot can leave a tiny random KV scale (x > 0 from U(-1e-3, 1e-3)); a stack that does not pin
    the scales serves it. The declared scale 1.0 makes R1 fail on any other value."""
    res, _, rollout = reference_sync(serving_config(sleep_mode=False, pin_kv_scales=False, kv_scale=0.5))
    r1 = [f for f in res.findings if f.invariant_id == "R1"]
    assert r1 and all(f.verdict == "fail" for f in r1)


def test_every_serving_check_is_in_the_catalog_with_a_source():
    for i in ("R1", "R2", "R3", "R4"):
        assert REGISTRY[i].family == "serving" and REGISTRY[i].source and REGISTRY[i].why


def test_check_sync_leaves_kv_scales_alone_on_a_bf16_kv_cache():
    """Seen on the H200 (2026-12-01): a plain vLLM 0.26 engine with a BF16 KV cache boots its (unread) KV scale
    buffers at a random dummy value. check_sync's default set judges only conditions the config has; naming R1
    still runs it."""
    from fp8check import check_sync
    bf16_kv = recommended_config("tiny-dense", "blockwise-fp32")
    bf16_kv = replace(bf16_kv, rollout=replace(bf16_kv.rollout, pin_kv_scales=False))
    _, trainer, rollout = reference_sync(bf16_kv)
    findings = check_sync(rollout, trainer.export_hf(), bf16_kv, on_fail="return")
    assert findings and "R1" not in {f.invariant_id for f in findings}
    assert not [f for f in findings if f.verdict == "fail"], findings
    forced = check_sync(rollout, trainer.export_hf(), bf16_kv, ids=["R1"], on_fail="return")
    assert forced and all(f.invariant_id == "R1" for f in forced)


NEAR_TIE = 0.02     # logits apart: a pick the full forward ranks second by less than this is a near-tie


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe", "tiny-hybrid"])
def test_greedy_with_the_kv_cache_picks_the_tokens_of_a_full_recompute(model):
    """The reference engine's greedy decoding reads a KV cache (full-attention models): each token must be one a
    forward over the whole sequence picks (hybrid models recompute; the loop below is the oracle for both). Picks,
    up to a near-tie: a decode step's GEMMs have another shape than the full forward's, and on some CPUs (AVX-512)
    the last-bit difference flips an FP8 activation code; tiny-moe then sees logits 0.004 apart swap places."""
    import torch
    from fp8check.harness.numerics.forward import logits
    from fp8check.harness.sync.pipeline import differential_prompts
    res, _, rollout = reference_sync(recommended_config(model, "blockwise-fp32"), checks=False)
    spec, W = res.config.spec, rollout.hf_weights()
    prompts = differential_prompts(spec.vocab_size)
    got = rollout.greedy(prompts, max_tokens=6)
    assert len(got) == len(prompts) and all(len(g) == 6 for g in got)
    gaps = []
    for p, g in zip(prompts, got):
        seq = list(p)
        with torch.no_grad():
            for tok in g:             # teacher-forced on the engine's own picks: the first divergence would cascade
                lg = logits(spec, W, seq)[-1]
                gaps.append(float(lg.max() - lg[tok]))
                seq.append(tok)
    assert all(gap <= NEAR_TIE for gap in gaps), gaps     # NaN fails
    assert sum(gap == 0.0 for gap in gaps) >= len(gaps) - 2, gaps   # a near-tie is the exception, not the rule


def test_r1_and_p1_read_the_calibrated_kv_scales_from_one_rule():
    """R1 (the scales the engine must serve) and P1's reference forward (the scales K and V are read back through)
    take the calibration from one rule: a changed trainer scale moves both, a missing one is named alike by both."""
    import torch

    from fp8check.harness.numerics.kv_cache import declared_kv_cache
    from fp8check.harness.snapshot import Snapshot
    from fp8check.invariants import run_catalog
    from fp8check.invariants.serving import _declared_kv
    cfg = serving_config(kv_scales="calibrated")
    ctx = reference_sync(cfg, checks=False)[0].context()
    name = "model.layers.0.self_attn.k_scale"
    tensors = dict(ctx.trainer.tensors)
    s = torch.tensor(0.3)                        # not a power of two: another scale rounds x differently
    tensors[name] = s
    ctx.trainer = Snapshot("trainer", tensors, ctx.trainer.meta)
    layer = next(layer for layer in _declared_kv(ctx) if ".layers.0." in layer)
    assert _declared_kv(ctx)[layer]["k"] == s.item()
    kv = declared_kv_cache(cfg, ctx.trainer)
    # x / s = 1 is exact in E4M3, so x comes back; at scale 1, 0.3 rounds to 0.3125
    assert kv(s.reshape(1), "model.layers.0.", "k").item() == s.item()
    assert [f.verdict for f in run_catalog(ctx, ids=["R1"])] == ["fail"]      # the engine still serves the old one
    del tensors[name]
    ctx.trainer = Snapshot("trainer", tensors, ctx.trainer.meta)
    reason = f"the trainer declares no {name} (calibrated KV-cache scales)"
    assert declared_kv_cache(cfg, ctx.trainer) == reason
    r1 = run_catalog(ctx, ids=["R1"])
    assert [(f.verdict, f.message) for f in r1] == [("unknown", reason)], r1
