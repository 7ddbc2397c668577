"""A new engine is one file plus one registry line: a rollout engine written here from scratch (not derived from
fp8check's reference) registers, runs behind the remote wrapper, syncs through the one pipeline and is judged by
the whole catalog; a buggy variant of it is caught; an engine missing part of the protocol is refused."""
import pytest
import torch

from fp8check.harness.numerics.settings import config_settings

from fp8check.harness.config import recommended_config
from fp8check.harness.digest import state_digest
from fp8check.harness.engines import EngineError, make_engine, register_engine
from fp8check.harness.engines.remote import Remote, runs_apart, start_call
from fp8check.harness.formats.bytes import poison_
from fp8check.harness.layouts import rank_name
from fp8check.harness.numerics.forward import Weights, act_quant, dequantize_state, token_logprobs
from fp8check.harness.record import EngineRecord, PostLoad, UpdateRecord
from fp8check.harness.sync.pipeline import DigestFirst, FullRead, run_sync


class DictEngine:
    """An engine that keeps the layout's parameters in a dict and installs a whole sync at once (no post-load
    transform): the simplest correct FP8 engine."""
    engine = "dict-engine"
    knobs = frozenset()
    swap_gate_up = False               # the buggy variant

    def __init__(self, config):
        self.config, self.tp = config, config.rollout.tp_size
        shapes = {rank_name(n, r, self.tp): s for r in range(self.tp)
                  for n, s in config.layout.vllm_param_shapes(r).items()}
        self.params = {n: torch.zeros(s, dtype=self._dtype(n)) for n, s in shapes.items()}
        self.updates, self.versions, self.poisoned = [], {}, False
        self.ptrs = {n: t.data_ptr() for n, t in self.params.items()}

    def _dtype(self, name):
        fp8 = self.config.layout.fp8_vllm
        base = name.split(":", 1)[-1]
        if base.endswith("_scale_inv"):
            return self.config.recipe.scale_dtype
        return self.config.recipe.fp8_dtype if base in fp8 else torch.bfloat16

    def poison(self):
        for t in self.params.values():
            poison_(t)
        self.poisoned = True

    def install(self, items, version=None, *, direct=False, knobs=None):
        items = list(items)
        hf = {n: t for n, t, _ in items}
        if self.swap_gate_up:
            for n in list(hf):
                if n.endswith("gate_proj.weight"):
                    u = n.replace("gate_proj", "up_proj")
                    hf[n], hf[u] = hf[u], hf[n]
        rec = UpdateRecord(version)
        for r in range(self.tp):
            for n, t in self.config.layout.hf_to_vllm(hf, r).items():
                self.params[rank_name(n, r, self.tp)].copy_(t)
                self.versions[rank_name(n, r, self.tp)] = [version]
        self.updates.append(rec)
        return rec

    def quantize_online(self, items):
        raise EngineError("dict-engine does not quantize")

    def state_digests(self):
        return {n: state_digest(t) for n, t in self.params.items()}

    def kernel_tensors(self, names=None):
        return {n: t.clone() for n, t in self.params.items() if names is None or n in names}

    def record(self):
        cfg = self.config
        return EngineRecord(self.engine, self.tp, list(cfg.ignored_layers),
                            sorted({p.dst.rsplit(".", 1)[0] for p in cfg.layout.vllm[0] if p.src in cfg.fp8_tensors}),
                            storage_moved=[n for n, t in self.params.items() if t.data_ptr() != self.ptrs[n]],
                            versions=dict(self.versions), updates=list(self.updates), poisoned=self.poisoned,
                            post_load=PostLoad("identity"), act_quant="vllm",
                            # how it runs, in the settings vocabulary (C10): an engine that says nothing is UNKNOWN
                            settings=config_settings(cfg))

    def generate_logprobs(self, prompts):
        cfg = self.config
        hf = cfg.layout.vllm_to_hf(self.params)
        W = Weights(dequantize_state(cfg.recipe, hf, cfg.fp8_tensors), cfg.fp8_tensors, act_quant("vllm", cfg.recipe))
        return [token_logprobs(cfg.spec, W, p) for p in prompts]


class BuggyDictEngine(DictEngine):
    engine = "dict-engine-buggy"
    swap_gate_up = True


class OneCallDictEngine(DictEngine):
    """The optional `record_and_digests`: the record and the digests in one call (what vLLM's adapter offers)."""
    engine = "dict-engine-one-call"
    calls: list = []

    def record(self):
        self.calls.append("record")
        return super().record()

    def state_digests(self):
        self.calls.append("state_digests")
        return super().state_digests()

    def record_and_digests(self):
        self.calls.append("record_and_digests")
        return super().record(), super().state_digests()


register_engine("rollout", "dict-engine", DictEngine)           # the one registry line
register_engine("rollout", "dict-engine-buggy", BuggyDictEngine)
register_engine("rollout", "dict-engine-one-call", OneCallDictEngine)


def _sync(name, capture):
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    with Remote("rollout", name, cfg) as engine:             # through the wire, in this process
        return run_sync(cfg, trainer, engine, capture=capture)


@pytest.mark.parametrize("capture", [FullRead(), DigestFirst()], ids=["full-read", "digest-first"])
def test_a_new_engine_runs_through_the_pipeline_and_the_whole_catalog(capture):
    res = _sync("dict-engine", capture)
    assert not res.fired and not res.unknown, [(f.invariant_id, f.message) for f in res.findings if f.verdict != "pass"]
    assert {f.invariant_id for f in res.findings} >= {"S1", "S2", "S3", "S4", "S5", "S6", "S7", "P1", "C1"}


def test_an_engine_offering_record_and_digests_is_asked_once_after_the_install():
    """Through the wire the wrapper knows what the engine offers; the digest-first capture then reads the record
    and the digests with one call, and the catalog's findings are the engine's as before."""
    from fp8check.harness.engines.remote import offers
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    with Remote("rollout", "dict-engine", cfg) as plain:
        assert plain.offered == frozenset() and not offers(plain, "record_and_digests")
    with Remote("rollout", "dict-engine-one-call", cfg) as engine:
        assert offers(engine, "record_and_digests")
    OneCallDictEngine.calls.clear()
    res = _sync("dict-engine-one-call", DigestFirst())
    assert not res.fired and not res.unknown, [(f.invariant_id, f.message) for f in res.findings if f.verdict != "pass"]
    # after the install: the one call, then the idempotence re-sync's two fingerprints (digests before, after)
    assert OneCallDictEngine.calls == ["record_and_digests", "state_digests", "state_digests"], OneCallDictEngine.calls
    OneCallDictEngine.calls.clear()
    assert not _sync("dict-engine-one-call", FullRead()).fired
    assert "record_and_digests" not in OneCallDictEngine.calls        # a full read asks for the record alone


def test_the_buggy_variant_is_caught():
    res = _sync("dict-engine-buggy", DigestFirst())
    assert {"S2", "S4"} <= set(res.fired) and res.fetched > 0


def test_an_engine_missing_part_of_the_protocol_is_refused():
    class Half:
        engine = "half"
        knobs = frozenset()

        def poison(self):
            pass

    with pytest.raises(EngineError, match="lacks the protocol's install"):
        register_engine("rollout", "half", Half)
    with pytest.raises(EngineError, match="unknown rollout engine"):
        make_engine("rollout", "nope", recommended_config("tiny-dense", "blockwise-fp32"))


def test_a_submitted_call_runs_and_raises_through_its_result():
    """`Remote.submit` (the pipeline starts S1's poison with it, before the wire) returns a pending call whose
    result is the engine's and whose failure is an EngineError naming it, like a plain call's."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    with Remote("rollout", "dict-engine", cfg) as engine:
        assert engine.submit("poison").result() is None
        assert engine.record().poisoned
        pending = engine.submit("kernel_tensors", ["no.such.parameter"])
        assert pending.result() == {}
        with pytest.raises(EngineError, match="no_such_method"):
            engine.submit("no_such_method").result()


def test_the_engine_record_stays_one_size_over_a_run():
    """A run with checks left on records the engine after every sync: the record carries the last update (what
    the checks read), not every update since the engine started (it grew with every sync, and crossed the RPC)."""
    from fp8check.harness.sync.pipeline import reference_engines, run_sync
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer, rollout = reference_engines(cfg)
    for step in range(3):
        trainer.optimizer_step()
        res = run_sync(cfg, trainer, rollout, checks=False, resync=False)
        assert len(res.rollout.meta.updates) == 1 and res.rollout.meta.last_update.version == res.version


class _Apart(Remote):
    """The wrapper as over a Ray actor (`runs_apart`), run in this process, logging when each call is started and
    when its result is awaited."""
    log: list = []
    in_ray = True

    def submit(self, method, *args, **kwargs):
        self.log.append(("start", method))
        pending, log = super().submit(method, *args, **kwargs), self.log

        class Logged:
            def result(self):
                log.append(("wait", method))
                return pending.result()
            reply_seconds = property(lambda self: pending.reply_seconds)
        return Logged()


@pytest.mark.parametrize("fails", [False, True], ids=["install", "failed-install"])
def test_an_engine_apart_has_its_record_queued_behind_the_install(fails, monkeypatch):
    """An engine in its own process gets the record's call before the pipeline waits for the install (its calls
    run in the order started: the record begins the moment the install ends, with no request's leg between);
    the findings are the same, a failed install is still recorded and judged, and the reply's leg is timed."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    if fails:
        monkeypatch.setattr(DictEngine, "install", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("full")))
    with _Apart("rollout", "dict-engine-one-call", cfg) as engine:
        _Apart.log.clear()
        res = run_sync(cfg, trainer, engine, capture=DigestFirst())
    order = [e for e in _Apart.log if e[1] in ("install", "record_and_digests")][:4]   # then S7's re-sync
    assert order == [("start", "install"), ("start", "record_and_digests"), ("wait", "install"),
                     ("wait", "record_and_digests")], order
    assert 0 <= res.seconds["capture.record.reply"] < 60
    if fails:
        assert any(e.startswith("install: ") and "full" in e for e in res.errors), res.errors
        assert {"S1"} <= set(res.fired), res.fired          # the poison survived: nothing was installed
    else:
        assert not res.fired and not res.unknown, [(f.invariant_id, f.message) for f in res.findings
                                                   if f.verdict != "pass"]
    with Remote("rollout", "dict-engine-one-call", cfg) as here:      # in this process: in order, one at a time
        assert not runs_apart(here)


def test_a_call_in_this_process_raises_through_its_result():
    """`start_call` on an engine in this process runs it at once; its failure is raised by `.result()`, where a
    remote call's is, so the pipeline handles both alike."""
    class Engine:
        def install(self, *a, **k):
            raise RuntimeError("refused")
    started = start_call(Engine(), "install", [], 1, direct=False)
    with pytest.raises(RuntimeError, match="refused"):
        started.result()
