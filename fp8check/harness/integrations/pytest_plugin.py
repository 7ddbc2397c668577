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

A check fails on a violated invariant and on one that could not be decided (UNKNOWN): `fp8check_sync(fn,
allow_unknown=True)`, or `--fp8check-allow-unknown` for the session, accepts UNKNOWN (a FAIL still fails). The
failure shows the findings, root first, not the plugin's frames.
"""
from __future__ import annotations

import json

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("fp8check", "fp8check: check your own FP8 weight sync")
    g.addoption("--fp8check-live", action="store_true", help="run fp8check_engine on real vLLM (a GPU machine)")
    g.addoption("--fp8check-model", default="tiny-dense", help="model for fp8check_config (a name or config.json)")
    g.addoption("--fp8check-recipe", default="blockwise-fp32", help="recipe for fp8check_config")
    g.addoption("--fp8check-allow-unknown", action="store_true",
                help="fp8check_sync passes a check that could not decide (UNKNOWN) instead of failing it")


def pytest_configure(config):
    config.addinivalue_line("markers", "fp8check(model=None, recipe=None): the SyncConfig fp8check fixtures use")


@pytest.fixture
def fp8check_config(request):
    from fp8check.harness.config import recommended_config
    m = request.node.get_closest_marker("fp8check")
    kw = dict(m.kwargs) if m else {}
    model = kw.pop("model", None) or request.config.getoption("--fp8check-model")
    recipe = kw.pop("recipe", None) or request.config.getoption("--fp8check-recipe")
    return recommended_config(model, recipe, **kw)


@pytest.fixture
def fp8check_trainer(fp8check_config):
    from fp8check.harness.engines.registry import make_engine
    t = make_engine("trainer", "cpu-reference", fp8check_config)
    t.optimizer_step()
    return t


@pytest.fixture(scope="session")
def _fp8check_live_engines():
    """Live engines by configuration, started when a test first needs one and closed when the session ends."""
    # kept for the session: a vLLM start is dear, and an engine starting while another process frees GPU memory
    # fails vLLM's memory profiling ("Error in memory profiling"), which closing one engine per test provoked
    engines: dict = {}
    yield engines
    while engines:
        engines.popitem()[1].close()


@pytest.fixture
def fp8check_engine(request, fp8check_config):
    if request.config.getoption("--fp8check-live"):
        from fp8check.harness.engines.remote import Remote
        live = request.getfixturevalue("_fp8check_live_engines")
        # one engine per engine configuration: the learner's settings (fp8_param, precision) do not change it
        key = json.dumps({k: v for k, v in fp8check_config.to_dict().items() if k != "trainer"}, sort_keys=True,
                         default=str)
        if key not in live:
            live[key] = Remote("rollout", "vllm", fp8check_config, ray=True, num_gpus=0.05)
        yield live[key]           # every sync poisons it first: a test never sees the previous one's weights
    else:
        from fp8check.harness.engines.registry import make_engine
        yield make_engine("rollout", "cpu-reference", fp8check_config)


class SyncChecker:
    """Runs a user's sync function into the engine and the catalog over what the engine then holds, and over what
    the function handed `load` (the wire: S1 coverage, S5 dtypes, S6 exclusions, S2/S3 at stage `wire`).

    `names="hf"` (default): the function gets the learner's FP8 forward weights and BF16 masters in HF checkpoint
    names. `names="megatron"`: it gets them as the learner holds them -- Megatron-Core names (fused `linear_qkv`
    interleaved by query group, `linear_fc1` = gate|up), each FP8 weight's `_scale_inv` in Transformer Engine's
    padded stored layout (`Float8BlockwiseQTensor._rowwise_scale_inv`), fp32 masters -- so the user's name
    mapping, de-interleaving and un-padding are under test. Each `load(bucket)` call is one bucket of one update,
    delivered as vLLM 0.26's weight transfer receives it (`start_weight_update`, `update_weights` per bucket,
    `finish_weight_update`): a layer is processed when its last element arrives. On an engine that quantizes the
    BF16 it is handed (`rollout.quantization` online-per-block / online-per-tensor / nemo-rl-blockwise) the engine
    is judged against its own rule over the learner's BF16 masters (`online_engine_state_hf`), as `check_sync`
    judges one."""

    def __init__(self, config, trainer, engine, allow_unknown: bool = False):
        self.config, self.trainer, self.engine = config, trainer, engine
        self.allow_unknown = allow_unknown

    def inputs(self, names: str):
        """(weights, masters) as the user's function receives them."""
        import torch
        if names == "hf":
            return (dict(self.trainer.export_hf()),
                    {n: t.to(torch.bfloat16) for n, t in self.trainer.master_hf().items()})
        if names == "megatron":
            from fp8check.harness.formats.te_layout import wire_to_te
            from fp8check.harness.layouts import is_scale_name
            fwd = self.trainer.fp8_forward_weights()
            weights = {n: (wire_to_te(t) if is_scale_name(n) else t) for n, t in fwd.items()}
            return weights, {n: t.float().clone() for n, t in self.trainer.masters.items()}
        raise ValueError(f"fp8check_sync: names must be 'hf' or 'megatron', got {names!r}")

    def __call__(self, sync_fn, *, ids=None, names: str = "hf", allow_unknown: bool | None = None):
        """Run `sync_fn` and the checks; raise SyncCheckFailed on a FAIL, or an UNKNOWN unless accepted
        (`allow_unknown`, default the session's `--fp8check-allow-unknown`). The one road with the user's function
        as its send and install: poison, `sync_fn`, then the shared capture (full read), re-sync (S7) and state
        checks."""
        __tracebackhide__ = True          # a failure shows the findings, not this function's source
        from fp8check.harness.integrations.check import SyncCheckFailed, failed, root_first, run_state_checks
        from fp8check.harness.snapshot.model import Snapshot
        from fp8check.harness.sync import stages
        from fp8check.harness.sync.capture import FullRead
        from fp8check.harness.sync.payload import payload_from_items
        from fp8check.harness.sync.pipeline import payload_snapshot
        from fp8check.harness.sync.timing import Clock
        from fp8check.invariants import CheckContext, check_ids
        if ids:
            ids = check_ids(ids)          # before the engine is touched
        cfg, version, eng = self.config, self.trainer.record().version, self.engine
        weights, masters = self.inputs(names)
        expected, reference = self.expected(version)
        stages.start_poison(eng).result()
        buckets, errors = self.send(sync_fn, weights, masters, version)
        sent = [item for batch in buckets for item in batch]
        capture = FullRead()
        record, got = stages.capture_state(capture, cfg, eng, expected, clock=Clock(), poisoned=True)
        payload = payload_from_items(cfg, sent, version)
        if sent and not errors:           # the same buckets into the same kind of update
            record.resync = stages.resync(cfg, capture, eng, got, payload.names(),
                                          lambda: self.install(buckets, version))
        record.version, record.errors = version, errors
        ctx = CheckContext(cfg, payload_snapshot(payload), Snapshot("trainer", expected, reference),
                           stages.rollout_snapshot(got, record))
        findings = root_first(run_state_checks(ctx, ids or None))
        if failed(findings, self.allow_unknown if allow_unknown is None else allow_unknown):
            raise SyncCheckFailed(findings)
        return findings

    def expected(self, version: int):
        """(what the engine must hold, checkpoint names; the trainer record it is judged as)."""
        if self.config.engine_online:
            # an engine that quantizes the BF16 it is handed: what it must hold is its own rule over a correct
            # BF16 sync of the learner's masters, as check_sync judges it
            from fp8check.harness.numerics.online import online_engine_state_hf
            from fp8check.harness.record import ENGINE_RULE, TrainerRecord
            return online_engine_state_hf(self.config, self.inputs("hf")[1]), TrainerRecord(ENGINE_RULE, version)
        return self.trainer.export_hf(), self.trainer.record()

    def _bucketed(self) -> bool:
        return callable(getattr(self.engine, "start_update", None))

    def install(self, buckets: list, version: int) -> None:
        """The buckets installed again as one update of the kind the function's was (the re-sync)."""
        eng = self.engine
        if self._bucketed():
            eng.start_update(version)
            for batch in buckets:
                eng.load_bucket([(n, t, version) for n, t in batch])
            eng.finish_update()
        else:
            eng.install([(n, t, version) for batch in buckets for n, t in batch], version)

    def send(self, sync_fn, weights: dict, masters: dict, version: int) -> tuple[list, list]:
        """The user's function as the send and install stages: each `load(batch)` is one bucket (delivered at once
        to an engine that takes buckets, else installed together after the function returns). Returns (the
        buckets as handed to `load`, the errors: the function's, rooted as SYNC_RAISED, or the engine's refusal;
        the engine's state is judged as left)."""
        from fp8check.harness.integrations.check import SYNC_RAISED
        eng, bucketed = self.engine, self._bucketed()
        buckets, errors, refused = [], [], []

        def load(batch):
            batch = [(str(n), t) for n, t in batch]
            buckets.append(batch)
            if bucketed:
                try:
                    eng.load_bucket([(n, t, version) for n, t in batch])
                except Exception as e:  # noqa: BLE001 - the engine refused the bucket (not the user's code)
                    refused.append(e)
                    raise

        try:
            if bucketed:
                eng.start_update(version)
            try:
                sync_fn(weights, masters, load)
            except Exception as e:  # noqa: BLE001 - the user's code raised: the root of whatever follows
                if refused and e is refused[-1]:
                    raise
                raise RuntimeError(f"{SYNC_RAISED} {e.__class__.__name__}: {e}") from e
            finally:
                if bucketed:              # finalized even when the function raised: the engine's state is judged
                    eng.finish_update()
            if not bucketed:
                self.install(buckets, version)
        except Exception as e:  # noqa: BLE001 - the engine (or the sync) refused: judged as left
            errors.append(f"{e.__class__.__name__}: {e}")
        return buckets, errors


@pytest.fixture
def fp8check_sync(request, fp8check_config, fp8check_trainer, fp8check_engine):
    return SyncChecker(fp8check_config, fp8check_trainer, fp8check_engine,
                       allow_unknown=request.config.getoption("--fp8check-allow-unknown"))
