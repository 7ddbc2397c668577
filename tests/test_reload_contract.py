"""S7 and the engine's declared reload (EngineRecord.reload): vLLM 0.34's VLLM_RELOAD_MODE=direct reruns post-load
processing over the whole model and has no rollback, so an update must deliver every module whole and a failed one
leaves nothing servable. The checks read the declaration; the vLLM adapter makes it from the release's facts and
the engine's setting (run here through the stand-in worker of tests/test_vllm_adapter_standin.py)."""
import sys
from copy import deepcopy
from dataclasses import replace

import pytest

from fp8check.harness.config import recommended_config
from fp8check.harness.record import Generation, ReloadContract
from fp8check.harness.snapshot.model import Snapshot
from fp8check.harness.sync.pipeline import reference_sync
from fp8check.invariants import REGISTRY, CheckContext
from fp8check.invariants.base import run_invariant
from test_vllm_adapter_standin import StandInLLM, fake_vllm_module  # noqa: F401 - the autouse fixture

DIRECT = ReloadContract("direct", reprocesses_undelivered=True, rollback=False, source="vLLM 0.34.0, direct")
LAYERWISE = ReloadContract("layerwise", source="vLLM 0.34.0")


@pytest.fixture(scope="module")
def clean():
    res, _, _ = reference_sync(recommended_config("tiny-dense", "blockwise-fp32"), check_ids=["S7"])
    return res


def s7(res, meta):
    ctx = CheckContext(res.config, res.payload, res.trainer, Snapshot("rollout", dict(res.rollout.tensors), meta))
    return [f for f in run_invariant(REGISTRY["S7"], ctx) if f.verdict == "fail"]


def test_a_clean_update_passes_under_either_declaration(clean):
    for rc in (None, LAYERWISE, DIRECT):
        meta = deepcopy(clean.rollout.meta)
        meta.reload = rc
        assert s7(clean, meta) == [], rc


def test_an_undelivered_module_fails_only_where_post_load_reruns_over_it(clean):
    meta = deepcopy(clean.rollout.meta)
    mod = meta.last_update.completed[0]
    meta.last_update.completed.remove(mod)
    meta.last_update.untouched.append(mod)
    meta.last_update.post_process[mod] = 1          # direct: every module's post-load ran
    meta.reload = DIRECT
    got = s7(clean, meta)
    assert [(f.tensor, "not delivered by this update" in f.message) for f in got] == [(mod, True)], got
    assert "direct reload (vLLM 0.34.0, direct)" in got[0].message
    meta.reload = LAYERWISE                         # the layerwise reload keeps an untouched layer as it was
    assert s7(clean, meta) == []


def test_a_failed_update_without_rollback_and_a_generation_after_it(clean):
    meta = deepcopy(clean.rollout.meta)
    meta.errors = ["RuntimeError: direct reload: finish without a begin"]
    meta.reload = LAYERWISE
    assert [f.message for f in s7(clean, meta)] == [f"update did not complete: {meta.errors[0]}"]
    meta.reload = DIRECT
    meta.generations = [Generation(False, [1])]
    msgs = [f.message for f in s7(clean, meta)]
    assert len(msgs) == 3 and "has no rollback" in msgs[1] and "1 generation(s) served" in msgs[2], msgs


# -- the adapter's declaration ---------------------------------------------------------------------------------------
def _engine(monkeypatch, version, mode):
    from fp8check.harness.engines.vllm import VLLMEngine
    from fp8check.harness.engines.vllm_api import facts_for
    if mode is not None:
        monkeypatch.setattr(sys.modules["vllm.envs"], "VLLM_RELOAD_MODE", mode, raising=False)
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    return VLLMEngine(cfg, llm=StandInLLM(cfg), facts=facts_for(version))


@pytest.mark.parametrize("version,mode,declared", [("0.34.0", "direct", "direct"), ("0.34.0", "layerwise", "layerwise"),
                                                    ("0.34.0", None, "layerwise"), ("0.30.0", "direct", "layerwise")])
def test_the_adapter_declares_the_release_and_setting(monkeypatch, version, mode, declared):
    e = _engine(monkeypatch, version, mode)
    rec = e.record()
    assert (rec.reload.mode, rec.reload.rollback, rec.engine) == (declared, declared != "direct", f"vllm-{version}")


def test_direct_mode_counts_modules_by_what_the_update_delivered(monkeypatch):
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.record import UpdateRecord
    e = _engine(monkeypatch, "0.34.0", "direct")
    trainer = make_engine("trainer", "cpu-reference", e.config)
    hf = trainer.export_hf()
    down = "model.layers.0.mlp.down_proj"
    items = [(n, t, 1) for n, t in hf.items() if not n.startswith(down)]
    partial = [(n, t, 1) for n, t in hf.items() if n != down + ".weight_scale_inv"]
    rec = UpdateRecord(1)
    e._close_update(rec, items)
    assert down in rec.untouched and down not in rec.completed
    rec = UpdateRecord(1)
    e._close_update(rec, partial)
    assert rec.partial == [down] and down not in rec.untouched
    rec = UpdateRecord(1)
    e._close_update(rec, [(n, t, 1) for n, t in hf.items()])
    assert rec.untouched == [] and rec.partial == [] and len(rec.completed) == len(e.layers)


def test_online_per_tensor_under_tp_is_refused_where_vllm_shares_the_scale():
    from fp8check.harness.engines.vllm import release_refuses
    from fp8check.harness.engines.vllm_api import facts_for
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(cfg, rollout=replace(cfg.rollout, quantization="online-per-tensor", tp_size=2))
    assert release_refuses(cfg, facts_for("0.27.0")) is None
    assert "one scale over the tensor-parallel group" in release_refuses(cfg, facts_for("0.28.0"))
