"""Live on the real engines: checked on-policy syncs over optimizer steps, policy probes, live fault injection,
and proof that checking never changes engine state."""
import pytest

from e2e.live import ALL_LIVE_FAULTS, DESTRUCTIVE, LiveSession
from faults import FAULTS
from faults.base import with_rollout
from harness.config import recommended_config
from harness.engines.digest import SEEDS

from .conftest import record

pytestmark = pytest.mark.gpu

SESSIONS: dict = {}


def session(trainer, engine, workdir, cfg, ignored_layers=None) -> LiveSession:
    key = (cfg.model, cfg.recipe.name, cfg.requant_ue8m0, tuple(ignored_layers or ()))
    if key not in SESSIONS:
        SESSIONS[key] = LiveSession(cfg, workdir, trainer=trainer(cfg), rollout=engine(cfg, ignored_layers))
    return SESSIONS[key]


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_live_clean_syncs_hold_every_invariant(trainer, engine, workdir, model):
    s = session(trainer, engine, workdir, recommended_config(model, "blockwise-fp32"))
    outs = []
    for _ in range(2):
        s.step()
        outs.append(s.sync(f"step {s.version}", probes=True))
    record("live_clean", model=model, syncs=[o.to_json() for o in outs])
    for o in outs:
        assert not o.fired and not o.unknown, o.to_json()
        assert o.fetched == 0, "digest-first: a clean sync moves no parameter"


def test_live_naive_bf16_sync_trips_s2(trainer, engine, workdir):
    s = session(trainer, engine, workdir, recommended_config("tiny-dense", "blockwise-fp32"))
    o = s.sync("naive", naive=True, probes=True)
    record("live_naive", outcome=o.to_json())
    assert {"S2", "S3", "S4"} & set(o.fired), o.to_json()


def test_live_fp32_scales_through_vllm_default_e8m0_trip_s3(trainer, engine, workdir):
    base = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = with_rollout(deep_gemm_e8m0=True)(base)     # vLLM 0.26's Hopper default
    s = session(trainer, engine, workdir, cfg)
    s.step()
    o = s.sync("fp32 scales, DeepGEMM E8M0 on", probes=True)
    record("live_e8m0", outcome=o.to_json())
    assert "S3" in o.fired and "C2" in o.fired, o.to_json()


def test_checks_never_change_engine_state(trainer, engine, workdir):
    s = session(trainer, engine, workdir, recommended_config("tiny-dense", "blockwise-fp32"))
    s.sync("before")
    ray = s.ray
    d0 = ray.get(s.rollout.device_digests.remote(SEEDS))
    m0 = ray.get(s.rollout.metadata.remote())
    # everything a check does: digests, metadata, full reads, probes
    ray.get(s.rollout.kernel_tensors.remote())
    ray.get(s.rollout.generate_logprobs.remote([[1, 2, 3, 4, 5, 6, 7, 8]]))
    from e2e.live import expected_engine_state
    from invariants import CheckContext, run_catalog
    from harness.snapshot import Snapshot
    hf = ray.get(s.trainer.export_hf.remote())
    run_catalog(CheckContext(s.config, None, Snapshot("trainer", hf), Snapshot("rollout", expected_engine_state(s.config, hf), m0)))
    d1 = ray.get(s.rollout.device_digests.remote(SEEDS))
    m1 = ray.get(s.rollout.metadata.remote())
    record("live_no_mutation", params=len(d0), same=d0 == d1)
    assert d0 == d1
    assert m0["storage_moved"] == m1["storage_moved"] and m0["versions"] == m1["versions"]


@pytest.mark.parametrize("fault", ALL_LIVE_FAULTS)
def test_live_fault_is_caught(trainer, engine, workdir, fault):
    f = FAULTS[fault]
    cfg = recommended_config("tiny-moe" if fault == "experts_permuted" else "tiny-dense", "blockwise-fp32")
    if not f.applies(cfg):
        pytest.skip(f"{fault} does not apply to {cfg.model}")
    s = session(trainer, engine, workdir, cfg)
    if s.previous_hf is None:
        s.step()
    o = s.sync(fault, fault=f)
    again = s.sync(f"clean after {fault}")
    record("live_fault", fault=fault, must_trip=list(f.trips), outcome=o.to_json(), recovered=again.to_json())
    assert set(o.fired) & set(f.trips), f"{fault}: fired {o.fired}, must trip one of {f.trips}"
    if fault in DESTRUCTIVE and again.fired:
        # the engine did not recover: the checks must keep saying so (never a green on a broken engine)
        assert "S1" in again.fired or "S2" in again.fired, again.to_json()
    else:
        assert not again.fired and not again.unknown, again.to_json()




def test_direct_load_weights_path(trainer, engine, workdir):
    """The direct path (model.load_weights, as some RL stacks call it) for comparison with the reload path.
    Measured on vLLM 0.26: after startup's post-load it refuses at the first FP8 linear (AttributeError, no
    weight loader), leaving the rest of the engine on old bytes; S1 must fire, the CPU reference must land in
    the same state (tests/test_live_driver_cpu.py), and a reload must bring the engine back to green."""
    s = session(trainer, engine, workdir, recommended_config("tiny-dense", "blockwise-fp32"))
    before = s.sync("reload path before")
    o = s.sync("direct load_weights", direct=True)
    again = s.sync("reload path after")
    record("live_direct_path", before=before.to_json(), direct=o.to_json(), recovered=again.to_json())
    assert {"S1", "S7"} <= set(o.fired), o.to_json()
    assert not again.fired and not again.unknown, again.to_json()
