"""Shared by the one-road tests (tests/test_one_road.py on the CPU, tests/gpu/test_one_road_live.py on vLLM): a
user's sync function carrying a fault through the same interceptors fp8check's own sync applies, judged by the
pytest plugin's driver."""
from fp8check.harness.integrations.check import SyncCheckFailed
from fp8check.harness.integrations.pytest_plugin import SyncChecker
from fp8check.harness.sync import stages
from fp8check.harness.sync.pipeline import FaultContext


class Holding:
    """The learner, holding the bytes a trainer fault gave it (what it exports)."""

    def __init__(self, trainer, hf):
        self._trainer, self._hf = trainer, hf

    def export_hf(self):
        return self._hf

    def __getattr__(self, name):
        return getattr(self._trainer, name)


def users_sync(cfg, version: int, hooks: stages.Interceptors):
    """A user's sync function: fp8check's own wire, corrupted where `hooks` say, handed to `load`."""
    def sync(weights, masters, load):
        wire = stages.send(cfg, weights, version, masters, FaultContext(cfg, weights, None, masters), hooks)
        load([(n, t) for n, t, _ in stages.install_items(wire.received)])
    return sync


def plugin_findings(cfg, trainer, engine, hooks: stages.Interceptors) -> list:
    """The plugin's findings for a user's sync of `trainer` into `engine` doing what `hooks` do: a trainer hook's
    bytes held by the learner, the payload and buckets hooks inside the user's function."""
    if hooks.on_trainer is not None:
        hf = trainer.export_hf()
        trainer = Holding(trainer, hooks.on_trainer(cfg, dict(hf), FaultContext(cfg, hf, None, trainer.master_hf)))
    sync = users_sync(cfg, trainer.record().version,
                      stages.Interceptors(on_payload=hooks.on_payload, on_buckets=hooks.on_buckets))
    try:
        return SyncChecker(cfg, trainer, engine)(sync)
    except SyncCheckFailed as e:
        return e.findings
