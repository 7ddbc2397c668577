"""Sleep/wake bookkeeping (harness.engines.sleepwake), written once for the CPU reference rollout and the vLLM
adapter: the refusals and their messages, the WakeEvent of a level-1 and a level-2 cycle, the syncs counted since a
wake. The vLLM adapter runs against a recording stand-in `LLM` (no vLLM here): what it asks of the engine, in
order, is pinned with the bookkeeping."""
import copy
import sys
import types

import pytest

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.protocol import EngineError
from fp8check.harness.engines.sleepwake import SleepWake
from fp8check.harness.record import KVScale, WakeEvent

BEFORE = {"a": "d0", "b": "d1"}
KV0 = {"attn": KVScale(1.0, 1.0, 1.0, 1.0)}
KV1 = {"attn": KVScale(0.0, 1.0, 1.0, 1.0)}


def cycle(sw: SleepWake, level: int, after: dict, kv_after=KV1) -> WakeEvent:
    sw.begin_sleep(level, lambda: dict(BEFORE), lambda: KV0)
    sw.slept(level)
    sw.begin_wake()
    return sw.woke(sw.awake(), after, kv_after)


# -- the shared class -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [0, 3, -1])
def test_a_level_other_than_1_or_2_is_refused_before_anything_is_read(level):
    sw, read = SleepWake(), []
    with pytest.raises(EngineError, match=rf"^sleep level must be 1 or 2, got {level}$"):
        sw.begin_sleep(level, lambda: read.append("digests"), lambda: read.append("kv"))
    assert read == [] and sw.level == 0


def test_sleeping_twice_and_waking_awake_are_refused():
    sw, read = SleepWake(), []
    with pytest.raises(EngineError, match=r"^the engine is not asleep$"):
        sw.begin_wake()
    sw.begin_sleep(1, lambda: read.append("digests") or {}, lambda: read.append("kv") or {})
    assert read == ["digests", "kv"] and sw.level == 0          # asleep only once the engine says so
    sw.slept(1)
    with pytest.raises(EngineError, match=r"^the engine is already asleep$"):
        sw.begin_sleep(2, lambda: read.append("again"), dict)
    assert read == ["digests", "kv"] and sw.level == 1
    sw.begin_wake()
    assert sw.level == 1 and sw.awake() == 1 and sw.level == 0
    with pytest.raises(EngineError, match=r"^the engine is not asleep$"):
        sw.begin_wake()


def test_while_asleep_installs_and_generations_are_refused_by_name():
    sw = SleepWake()
    sw.refuse_if_asleep("install")
    sw.refuse_if_asleep("generation")
    sw.begin_sleep(2, dict, dict)
    sw.slept(2)
    with pytest.raises(EngineError, match=r"^weights installed while the engine is asleep \(wake it first\)$"):
        sw.refuse_if_asleep("install")
    with pytest.raises(EngineError, match=r"^generation requested while the engine is asleep$"):
        sw.refuse_if_asleep("generation")


def test_level_1_wake_event_names_what_the_wake_did_not_restore():
    sw = SleepWake()
    w = cycle(sw, 1, dict(BEFORE))
    assert sw.wake_event is w
    assert w == WakeEvent(1, [], kv_scales_before=KV0, kv_scales=KV1)
    w = cycle(sw, 1, {"b": "x", "a": "d0", "c": "new"})      # sorted; a name unknown before the sleep changed
    assert (w.level, w.changed) == (1, ["b", "c"])


def test_level_2_wake_event_and_a_generation_before_the_next_sync():
    sw = SleepWake()
    sw.note_generation()                                       # no wake yet: nothing to mark
    w = cycle(sw, 2, {"a": "g", "b": "g"})
    assert w == WakeEvent(2, ["a", "b"], kv_scales_before=KV0, kv_scales=KV1)
    sw.note_generation()
    assert w.generated_before_sync
    w = cycle(sw, 2, {"a": "g", "b": "g"})
    sw.synced()
    sw.note_generation()                                       # served after a sync: the weights are the sync's
    assert not w.generated_before_sync
    w = cycle(sw, 1, dict(BEFORE))
    sw.note_generation()                                       # level 1 restored the weights
    assert not w.generated_before_sync


def test_syncs_are_counted_on_the_last_wake_only():
    sw = SleepWake()
    sw.synced()                                                # before any wake: no event to count on
    assert sw.wake_event is None
    first = cycle(sw, 1, dict(BEFORE))
    assert (first.synced_since, first.syncs_since) == (False, 0)
    sw.synced()
    sw.synced()
    assert (first.synced_since, first.syncs_since) == (True, 2)
    second = cycle(sw, 2, dict(BEFORE))
    sw.synced()
    assert (second.synced_since, second.syncs_since) == (True, 1) and first.syncs_since == 2


# -- the vLLM adapter against a recording stand-in ---------------------------------------------------------------
class RecordingLLM:
    """An `LLM`-shaped object that logs every RPC and engine call; a level-2 sleep discards one parameter."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.digests = {"w": "d0", "s": "e0"}
        self.kv = {"attn": {"k": 0.5, "v": 0.5, "q": 0.5, "prob": 0.5}}

    def collective_rpc(self, method, args=()):
        self.calls.append((method, *args))
        if method == "fp8check_instrument":
            return [[]]
        if method == "fp8check_settings":
            return [{}]
        if method == "fp8check_kv_scales":
            return [copy.deepcopy(self.kv)]
        if method == "fp8check_digests":
            return [dict(self.digests)]
        if method == "fp8check_pin_kv_scales":
            for v in self.kv.values():
                v.update(k=args[0], v=args[0], q=args[0], prob=args[0])
        if method == "fp8check_serving_fault":
            for which, x in (args[0].get("wake_kv_scales") or {}).items():
                for v in self.kv.values():
                    v[which] = x
        if method == "fp8check_counts":
            return [({}, {})]
        return [True]

    def sleep(self, level):
        self.calls.append(("sleep", level))
        if level == 2:
            self.digests["w"] = "garbage"

    def wake_up(self):
        self.calls.append(("wake_up",))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, sp, use_tqdm=False):
        self.calls.append(("generate",))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[1])]) for _ in prompts]


@pytest.fixture
def vllm_engine(monkeypatch):
    from fp8check.harness.engines.vllm import VLLMEngine
    from fp8check.harness.engines.vllm_api import facts_for
    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    eng = VLLMEngine(cfg, llm=RecordingLLM(), facts=facts_for("0.26.0"))
    eng.llm.calls.clear()
    return eng


ONE = KVScale(1.0, 1.0, 1.0, 1.0)


def test_vllm_sleep_refusals_and_what_each_call_asks_of_the_engine(vllm_engine):
    e, calls = vllm_engine, vllm_engine.llm.calls
    with pytest.raises(EngineError, match=r"^sleep level must be 1 or 2, got 3$"):
        e.sleep(3)
    with pytest.raises(EngineError, match=r"^the engine is not asleep$"):
        e.wake()
    assert calls == [] and e.sleep_level == 0 and e.wake_event is None
    e.sleep(1)
    assert calls == [("fp8check_digests", False), ("fp8check_kv_scales",), ("sleep", 1)] and e.sleep_level == 1
    calls.clear()
    with pytest.raises(EngineError, match=r"^the engine is already asleep$"):
        e.sleep(2)
    with pytest.raises(EngineError, match=r"^generation requested while the engine is asleep$"):
        e.greedy([[1, 2]])
    with pytest.raises(EngineError, match=r"^weights installed while the engine is asleep \(wake it first\)$"):
        e.install([], 1)
    assert calls == [] and e.sleep_level == 1
    e.wake()
    assert calls == [("fp8check_empty_cache",), ("wake_up",), ("fp8check_digests", False),
                     ("fp8check_pin_kv_scales", 1.0), ("fp8check_kv_scales",)], calls
    assert e.sleep_level == 0
    assert e.wake_event == WakeEvent(1, [], kv_scales_before={"attn": KVScale(1.0, 1.0, 1.0, 1.0)},
                                     kv_scales={"attn": ONE})


def test_vllm_level_2_wake_event_generation_and_syncs_counted(vllm_engine):
    e, calls = vllm_engine, vllm_engine.llm.calls
    e.sleep(2)
    calls.clear()
    e.wake(kv_scales={"k": 0.0})
    assert calls[:3] == [("fp8check_empty_cache",), ("wake_up",),
                         ("fp8check_serving_fault", {"wake_kv_scales": {"k": 0.0}})], calls
    w = e.wake_event
    assert (w.level, w.changed, w.generated_before_sync, w.synced_since, w.syncs_since) == (2, ["w"], False, False, 0)
    assert w.kv_scales_before == {"attn": ONE} and w.kv_scales == {"attn": ONE}     # pinned again after the fault
    e.greedy([[1, 2]])
    assert w.generated_before_sync and e.record is not None
    e.install([], 1)
    assert (w.synced_since, w.syncs_since) == (True, 1)
    e.install([], 2)
    assert (w.synced_since, w.syncs_since) == (True, 2) and e.wake_event is w
    # the next cycle is a fresh event; a generation after a level-1 wake is not the level-2 fault
    e.sleep(1)
    e.wake()
    assert e.wake_event is not w and e.wake_event.syncs_since == 0
    e.greedy([[1, 2]])
    assert not e.wake_event.generated_before_sync
    # the adapter refuses a generation while asleep before marking the last level-2 wake
    e.sleep(2)
    e.wake()
    e.sleep(1)
    with pytest.raises(EngineError):
        e.greedy([[1, 2]])
    assert not e.wake_event.generated_before_sync


def test_vllm_a_wake_up_that_raises_leaves_the_engine_asleep(vllm_engine):
    e = vllm_engine
    e.sleep(2)

    def fails():
        raise RuntimeError("wake_up failed")
    e.llm.wake_up = fails
    with pytest.raises(RuntimeError, match="wake_up failed"):
        e.wake()
    assert e.sleep_level == 2 and e.wake_event is None
    del e.llm.wake_up
    e.wake()
    assert e.sleep_level == 0 and e.wake_event.level == 2


# -- the CPU reference rollout ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_parts():
    from fp8check.harness.engines.registry import make_engine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    return cfg, [(n, t, 1) for n, t in trainer.export_hf().items()]


@pytest.fixture
def cpu_rollout(cpu_parts):
    from fp8check.harness.engines.registry import make_engine
    cfg, items = cpu_parts
    r = make_engine("rollout", "cpu-reference", cfg)
    r.install(items, 1)
    return r


def test_cpu_refusals_and_a_level_1_cycle_restores_every_byte(cpu_rollout):
    r = cpu_rollout
    with pytest.raises(EngineError, match=r"^sleep level must be 1 or 2, got 0$"):
        r.sleep(0)
    with pytest.raises(EngineError, match=r"^the engine is not asleep$"):
        r.wake()
    before = r.state_digests()
    r.sleep(1)
    assert r.sleep_level == 1 and r.serving_state().sleep_level == 1
    with pytest.raises(EngineError, match=r"^the engine is already asleep$"):
        r.sleep(1)
    with pytest.raises(EngineError, match=r"^generation requested while the engine is asleep$"):
        r.greedy([[1, 2]])
    with pytest.raises(EngineError, match=r"^weights installed while the engine is asleep \(wake it first\)$"):
        r.install([], 2)
    r.wake(kv_scales={"k": 0.0})
    w = r.wake_event
    assert r.sleep_level == 0 and r.state_digests() == before
    assert (w.level, w.changed, w.syncs_since, w.synced_since, w.generated_before_sync) == (1, [], 0, False, False)
    # the fault's scales are pinned again by the wake (uniform scales), and the record carries a copy
    assert w.kv_scales_before and all(v == ONE for v in [*w.kv_scales_before.values(), *w.kv_scales.values()])
    assert r.serving_state().wake == w and r.serving_state().wake is not w


def test_cpu_level_2_changes_every_weight_and_counts_syncs(cpu_rollout, cpu_parts):
    r, (_, items) = cpu_rollout, cpu_parts
    before = r.state_digests()
    r.sleep(2)
    r.wake()
    w = r.wake_event
    assert w.level == 2 and w.changed == sorted(before) and not w.synced_since
    r.generate_logprobs([[1, 2, 3]])
    assert w.generated_before_sync
    r.install(items, 2)
    r.install(items, 3)
    assert (w.synced_since, w.syncs_since) == (True, 2) and r.state_digests() == before
    # the reference marks a generation on the last level-2 wake before refusing it while asleep
    r.sleep(2)
    r.wake()
    r.sleep(1)
    with pytest.raises(EngineError):
        r.greedy([[1, 2]])
    assert r.serving_state().wake.generated_before_sync
