"""The CPU reference rollout installs exactly what real vLLM 0.26 installs (after loading and post-processing),
parameter by parameter and byte for byte, for each DeepGEMM setting; and its forward scores prompts like vLLM.
Each configuration's engine is released after its test (nine engine starts in one phase)."""
from dataclasses import replace

import pytest
import torch

from fp8check.e2e.conformance import configs
from fp8check.harness.formats.bytes import as_bytes
from fp8check.harness.sync.pipeline import install_items, reference_sync
from fp8check.invariants.probes import PROMPTS

from .conftest import record

pytestmark = pytest.mark.gpu


def _install(eng, res):
    eng.poison()
    eng.install(install_items(res.received), res.version)


@pytest.mark.parametrize("name", list(configs()))
def test_installed_state_matches_reference(engine, release, name):
    cfg = configs()[name]
    eng = engine(cfg)
    res, _, _ = reference_sync(cfg, checks=False)
    _install(eng, res)
    live = eng.kernel_tensors()
    meta = eng.record()
    ref = res.rollout.tensors
    only_live, only_ref = sorted(set(live) - set(ref)), sorted(set(ref) - set(live))
    diff = []
    for n in sorted(set(live) & set(ref)):
        a, b = live[n], ref[n]
        if a.shape != b.shape or a.dtype != b.dtype:
            diff.append({"param": n, "live": [list(a.shape), str(a.dtype)], "ref": [list(b.shape), str(b.dtype)]})
        elif not torch.equal(as_bytes(a), as_bytes(b)):
            ne = (as_bytes(a) != as_bytes(b))
            diff.append({"param": n, "differing_bytes": int(ne.sum()), "of": ne.numel()})
    pp = meta.updates[-1].post_process
    record("vllm_installed_state", engine=name, params=len(live), only_live=only_live, only_ref=only_ref,
           differing=diff[:12], n_diff=len(diff), post_process=pp, storage_moved=meta.storage_moved,
           declared_post_load=meta.post_load.kind, boot_kv_scales={k: vars(v) for k, v in
                                                                  (meta.serving.boot_kv_scales or {}).items()})
    if name not in ("dense-fp32", "moe-fp32"):        # the logprob test below reuses these two
        release(eng)
    assert not only_live and not only_ref, f"parameter names differ: live-only {only_live[:5]}, reference-only {only_ref[:5]}"
    assert not diff, f"{len(diff)} parameters differ from the CPU reference: {diff[:3]}"
    assert set(pp.values()) == {1}, f"post-load runs per layer: {pp}"
    assert not meta.storage_moved, "reload moved parameter storage"


@pytest.mark.parametrize("name", ["dense-fp32", "moe-fp32"])
def test_logprobs_match_reference_forward(engine, name):
    """Stated tolerance: mean |dlogprob| < 0.15 (bf16 activations and residuals in vLLM vs the fp32 reference),
    and at most half of the distance to a *different* policy (the control: another seed)."""
    cfg = configs()[name]
    eng = engine(cfg)
    res, _, ref_rollout = reference_sync(cfg, checks=False)
    _install(eng, res)
    live = eng.generate_logprobs(PROMPTS)
    ref = ref_rollout.generate_logprobs(PROMPTS)
    other = reference_sync(replace(cfg, seed=cfg.seed + 1), checks=False)[2].generate_logprobs(PROMPTS)
    d = torch.cat([a.double() - b.double() for a, b in zip(live, ref)]).abs()
    dc = torch.cat([a.double() - b.double() for a, b in zip(live, other)]).abs()
    record("vllm_logprob_conformance", engine=name, mean_abs=float(d.mean()), max_abs=float(d.max()),
           tokens=d.numel(), control_mean_abs=float(dc.mean()))
    assert float(d.mean()) < 0.15 and float(d.mean()) < 0.5 * float(dc.mean()), (float(d.mean()), float(dc.mean()))


def test_state_digest_is_device_independent(engine):
    """The streaming digest the engine computes on its GPU equals the host digest of the bytes it returns."""
    from fp8check.harness.digest import state_digest
    eng = engine(configs()["dense-fp32"])
    on_device = eng.state_digests()
    host = {n: state_digest(t) for n, t in eng.kernel_tensors().items()}
    record("digest_device_vs_host", params=len(host), equal=on_device == host)
    assert on_device == host
