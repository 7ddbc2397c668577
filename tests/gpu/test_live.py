"""Live on the real engines (Megatron-Core/TE trainer and vLLM as Ray actors on one GPU): checked on-policy syncs
over optimizer steps, policy probes, every live-injectable fault, the direct load_weights path, and proof that
checking never changes engine state. One engine per configuration; a destructive fault that leaves the engine
broken gets it replaced before the next one."""
import pytest

from fp8check.e2e.live import LiveSession
from fp8check.faults import FAULTS, live_faults
from fp8check.faults.base import with_rollout
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.vllm import VLLMEngine

from .conftest import record

pytestmark = pytest.mark.gpu

SESSIONS: dict = {}
DENSE = recommended_config("tiny-dense", "blockwise-fp32")
# one or two faults per family here (with the destructive ones, which replace the engine); `fp8check live --faults
# all` (ci/gpu_live.sh) injects every live-injectable fault through the same session code
SUBSET = ("scale_x2_block", "fp32_scales_rounded_pow2", "q_k_swapped", "rows_shifted_one_block", "bf16_into_fp8_slot",
          "scale_dropped", "bucket_lost", "postprocess_twice", "stale_layer_unstamped", "norm_quantized_in_trainer",
          "bytes_corrupted", "tensor_duplicated", "write_into_detached_copy", "logprobs_at_sampling_temperature",
          "zero_sign_canonicalized", "quantize_failure_sends_bf16", "trainer_fp8_workspace_stale", "scale_nan_block")
DENSE_FAULTS = [f for f in live_faults(DENSE, VLLMEngine.knobs) if f in SUBSET]


def session(trainer, engine, cfg) -> LiveSession:
    key = (cfg.model, cfg.recipe.name, cfg.requant_ue8m0)
    if key not in SESSIONS:
        SESSIONS[key] = LiveSession(cfg, trainer_engine=trainer(cfg), rollout_engine=engine(cfg))
    return SESSIONS[key]


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_live_clean_syncs_hold_every_invariant(trainer, engine, model):
    s = session(trainer, engine, recommended_config(model, "blockwise-fp32"))
    outs = []
    for _ in range(2):
        s.step()
        outs.append(s.sync(f"step {s.version}", probes=True))
    record("live_clean", model=model, syncs=[o.to_json() for o in outs])
    for o in outs:
        assert not o.fired and not o.unknown, o.to_json()
        assert o.fetched == 0, "digest-first: a clean sync moves no parameter"
        # P1 judged the engines' own log-probs against a bound derived for this sync from the trainer's bytes
        assert o.extra["probe_floor"] is not None and o.extra["probe_bounds"]["mean_abs_dlogprob"] >= 0.05


def test_live_naive_bf16_sync_trips_s2(trainer, engine):
    s = session(trainer, engine, DENSE)
    o = s.sync("naive", naive=True, probes=True)
    record("live_naive", outcome=o.to_json())
    assert {"S2", "S3", "S4"} & set(o.fired), o.to_json()


def test_live_fp32_scales_through_vllm_default_e8m0_trip_s3(trainer, engine):
    cfg = with_rollout(deep_gemm_e8m0=True)(DENSE)     # vLLM 0.26's Hopper default
    s = session(trainer, engine, cfg)
    s.step()
    o = s.sync("fp32 scales, DeepGEMM E8M0 on", probes=True)
    record("live_e8m0", outcome=o.to_json())
    assert "S3" in o.fired and "C2" in o.fired, o.to_json()


def test_checks_never_change_engine_state(trainer, engine):
    s = session(trainer, engine, DENSE)
    s.sync("before")
    d0, m0 = s.rollout.state_digests(), s.rollout.record()
    s.rollout.kernel_tensors()                         # everything a check does: digests, record, full reads,
    s.rollout.generate_logprobs([[1, 2, 3, 4, 5, 6, 7, 8]])   # probes, the catalog
    from fp8check.harness.snapshot import Snapshot
    from fp8check.harness.sync.capture import expected_engine_state
    from fp8check.invariants import CheckContext, run_catalog
    hf = s.trainer.export_hf()
    run_catalog(CheckContext(s.config, None, Snapshot("trainer", hf, s.trainer.record()),
                             Snapshot("rollout", expected_engine_state(s.config, hf, m0.post_load), m0)))
    d1, m1 = s.rollout.state_digests(), s.rollout.record()
    record("live_no_mutation", params=len(d0), same=d0 == d1)
    assert d0 == d1
    assert m0.storage_moved == m1.storage_moved and m0.versions == m1.versions


@pytest.mark.parametrize("fault", DENSE_FAULTS + ["experts_permuted"])
def test_live_fault_is_caught(trainer, engine, release, fault):
    f = FAULTS[fault]
    cfg = recommended_config("tiny-moe", "blockwise-fp32") if fault == "experts_permuted" else DENSE
    s = session(trainer, engine, cfg)
    if s.previous_hf is None:
        s.step()
    o = s.sync(fault, fault=f)
    again = s.sync(f"clean after {fault}")
    record("live_fault", fault=fault, must_trip=list(f.trips), destructive=f.destructive, outcome=o.to_json(),
           recovered=again.to_json())
    broken = bool(again.fired or again.unknown)
    if broken and f.destructive:                       # replace the engine for the next test
        release(s.rollout)
        SESSIONS.pop((cfg.model, cfg.recipe.name, cfg.requant_ue8m0))
    assert f.verdict(o.fired) == "caught", f"{fault}: fired {o.fired}, must all fire {f.trips}"
    if broken:
        assert f.destructive, again.to_json()
        assert {"S1", "S2", "S4", "S7"} & set(again.fired), again.to_json()   # a broken engine keeps failing


def test_live_p1_is_the_catch_of_a_sampler_temperature(trainer, engine):
    """Every byte right, vLLM's LogitsProcessor.scale at 1.25 (log-probs at T = 0.8): only P1 fires, against a
    bound derived from the trainer's own bytes for this sync; the next clean sync resets the scale and passes."""
    s = session(trainer, engine, DENSE)
    o = s.sync("temperature", fault=FAULTS["logprobs_at_sampling_temperature"])
    again = s.sync("clean after temperature", probes=True)
    record("live_p1_temperature", outcome=o.to_json(), recovered=again.to_json())
    assert o.fired == ["P1"], o.to_json()
    assert not again.fired and not again.unknown, again.to_json()


def test_direct_load_weights_path(trainer, engine):
    """model.load_weights after startup: vLLM 0.26 refuses it at the first FP8 linear (no weight loader), leaving
    the rest on old bytes; S1 must fire, the CPU reference lands in the same state (tests/test_live_driver_cpu.py),
    and a reload brings the engine back to green."""
    s = session(trainer, engine, DENSE)
    before = s.sync("reload path before")
    o = s.sync("direct load_weights", direct=True)
    again = s.sync("reload path after")
    record("live_direct_path", before=before.to_json(), direct=o.to_json(), recovered=again.to_json())
    assert {"S1", "S7"} <= set(o.fired), o.to_json()
    assert not again.fired and not again.unknown, again.to_json()


class _LearnerScaled:
    """The session's learner, its probe log-probs multiplied by `factor` (a learner whose measured log-probs are
    off); everything else is the learner's own."""

    def __init__(self, trainer, factor: float):
        self._trainer, self._factor = trainer, factor

    def __getattr__(self, name):
        return getattr(self._trainer, name)

    def logprobs(self, prompts):
        return [x * self._factor for x in self._trainer.logprobs(prompts)]


def test_live_p1_fails_a_learner_off_by_x1_6_and_passes_a_correct_sync(trainer, engine):
    """P1's bound comes from the reference forwards of the trainer's bytes and of a perfect sync's engine, never
    from either engine's measurement: a correct sync passes; the same sync with the learner's measured log-probs
    x1.6 fails, naming the learner against its own reference, under the same bound (it passed when the floor was
    scored against the learner's measurement)."""
    s = session(trainer, engine, DENSE)
    if s.previous_hf is None:
        s.step()
    good = s.sync("P1: a correct sync", probes=True)
    real = s.trainer
    s.trainer = _LearnerScaled(real, 1.6)
    try:
        off = s.sync("P1: the learner's log-probs x1.6", probes=True)
    finally:
        s.trainer = real
    record("live_p1_learner_off", correct=good.to_json(), off=off.to_json())
    assert not good.fired and not good.unknown, good.to_json()
    assert good.extra["probe_learner"] is not None and good.extra["probe_sampler"] is not None, good.to_json()
    assert off.fired == ["P1"], off.to_json()
    p1 = [f for f in off.findings if f.invariant_id == "P1" and f.verdict == "fail"]
    assert any(f.message.endswith("against the reference forward of its own bytes") for f in p1), off.to_json()
    assert off.extra["probe_bounds"] == pytest.approx(good.extra["probe_bounds"], rel=1e-3), off.to_json()
