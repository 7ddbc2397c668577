"""The sync reports the garbage collector's pauses inside its timed capture and checks (`capture.gc`, `checks.gc`):
at Qwen3-30B-A3B one check's time varied seven-fold between identical syncs, and a full collection of a trainer's
heap is the suspect these figures settle. A collection forced inside the checks shows there, and the callback is
gone afterwards (also when the checks raise)."""
import gc

import pytest

from fp8check.harness.config import recommended_config
from fp8check.harness.sync.pipeline import reference_engines, run_sync


@pytest.fixture(scope="module")
def engines():
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    return cfg, reference_engines(cfg)


def test_a_collection_inside_the_checks_is_reported(engines, monkeypatch):
    from fp8check import invariants
    cfg, (trainer, rollout) = engines
    real = invariants.run_catalog
    junk = [[i] for i in range(200_000)]         # something for a full collection to walk

    def collecting(*a, **k):
        gc.collect()
        return real(*a, **k)
    monkeypatch.setattr(invariants, "run_catalog", collecting)
    before = list(gc.callbacks)
    res = run_sync(cfg, trainer, rollout, check_ids=["S3"], resync=False)
    assert res.seconds["checks.gc"] > 0 and "capture.gc" in res.seconds
    assert gc.callbacks == before
    del junk


def test_the_callback_is_removed_when_the_checks_raise(engines, monkeypatch):
    from fp8check import invariants
    cfg, (trainer, rollout) = engines

    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(invariants, "run_catalog", broken)
    before = list(gc.callbacks)
    with pytest.raises(RuntimeError):
        run_sync(cfg, trainer, rollout, check_ids=["S3"], resync=False)
    assert gc.callbacks == before
