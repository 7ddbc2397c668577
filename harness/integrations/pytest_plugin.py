"""fp8check's pytest plugin (entry point `pytest11`): test your own weight-sync code against the catalog.

    def my_sync(weights, masters, load):            # your name mapping, exclusions, quantization, bucketing
        load([(name, tensor) for name, tensor in ...])

    def test_my_sync(fp8check_sync):
        fp8check_sync(my_sync)                      # raises SyncCheckFailed naming every violated invariant

Fixtures: `fp8check_config` (a SyncConfig; `@pytest.mark.fp8check(model=..., recipe=...)` or the command-line
options pick it), `fp8check_trainer` (the reference learner after one optimizer step: its FP8 forward weights are
what a sync must install), `fp8check_engine` (the CPU reference vLLM engine, or a real vLLM engine with
`--fp8check-live` on a GPU machine), and `fp8check_sync`, which poisons the engine, runs your function, reads the
engine's state and runs the catalog. Your function gets the learner's FP8 forward weights (HF checkpoint names),
its BF16 masters, and `load(items)`, the engine's checkpoint-format loader (vLLM's layerwise reload). With
`harness.strategies` you can fuzz it on a laptop.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("fp8check", "fp8check: check your own FP8 weight sync")
    g.addoption("--fp8check-live", action="store_true", help="run fp8check_engine on real vLLM (a GPU machine)")
    g.addoption("--fp8check-model", default="tiny-dense", help="model for fp8check_config (a name or config.json)")
    g.addoption("--fp8check-recipe", default="blockwise-fp32", help="recipe for fp8check_config")


def pytest_configure(config):
    config.addinivalue_line("markers", "fp8check(model=None, recipe=None): the SyncConfig fp8check fixtures use")


@pytest.fixture
def fp8check_config(request):
    from harness.config import recommended_config
    m = request.node.get_closest_marker("fp8check")
    kw = dict(m.kwargs) if m else {}
    model = kw.pop("model", None) or request.config.getoption("--fp8check-model")
    recipe = kw.pop("recipe", None) or request.config.getoption("--fp8check-recipe")
    return recommended_config(model, recipe, **kw)


@pytest.fixture
def fp8check_trainer(fp8check_config):
    from harness.engines.registry import make_engine
    t = make_engine("trainer", "cpu-reference", fp8check_config)
    t.optimizer_step()
    return t


@pytest.fixture
def fp8check_engine(request, fp8check_config):
    if request.config.getoption("--fp8check-live"):
        from harness.engines.remote import Remote
        eng = Remote("rollout", "vllm", fp8check_config, ray=True, num_gpus=0.3)
        yield eng
        eng.close()
    else:
        from harness.engines.registry import make_engine
        yield make_engine("rollout", "cpu-reference", fp8check_config)


class SyncChecker:
    """Runs a user's sync function into the engine and the catalog over what the engine then holds."""

    def __init__(self, config, trainer, engine):
        self.config, self.trainer, self.engine = config, trainer, engine

    def __call__(self, sync_fn, *, ids=None):
        from harness.integrations.check import SyncCheckFailed, run_state_checks
        from harness.record import Resync
        from harness.snapshot.model import Snapshot
        from harness.sync.capture import FullRead
        from invariants import CheckContext
        import torch
        cfg, version = self.config, self.trainer.record().version
        weights = self.trainer.export_hf()
        masters = {n: t.to(torch.bfloat16) for n, t in self.trainer.master_hf().items()}
        items = []

        def load(batch):                              # every bucket of one sync goes into one reload
            items.extend((str(n), t, version) for n, t in batch)

        self.engine.poison()
        errors = []
        try:
            sync_fn(dict(weights), dict(masters), load)
            self.engine.install(items, version)
        except Exception as e:  # noqa: BLE001 - the engine (or the sync) refused: judged as left
            errors.append(f"{e.__class__.__name__}: {e}")
        record = self.engine.record()
        got = FullRead().capture(cfg, self.engine, weights, record)
        if items and not errors:                      # idempotence: the same sync again changes nothing
            self.engine.install(items, version)
            after = self.engine.kernel_tensors()
            record.resync = Resync(sorted(n for n, t in got.tensors.items() if not FullRead.same(t, after.get(n))))
        record.version, record.errors, record.poisoned = version, errors, True
        ctx = CheckContext(cfg, None, Snapshot("trainer", weights, self.trainer.record()),
                           Snapshot("rollout", got.tensors, record))
        findings = run_state_checks(ctx, ids or None)
        if any(f.verdict == "fail" for f in findings):
            raise SyncCheckFailed(findings)
        return findings


@pytest.fixture
def fp8check_sync(fp8check_config, fp8check_trainer, fp8check_engine):
    return SyncChecker(fp8check_config, fp8check_trainer, fp8check_engine)
