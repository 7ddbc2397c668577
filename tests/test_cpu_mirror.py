"""The CPU reference rollout is the pure mirror of vLLM's load path; the fault knobs live in its subclass
(cpu/perturbed.py, registered as "cpu-reference"), as the vLLM side splits the user-facing extension from
fp8check's test extension."""
import inspect
import io
import tokenize

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines import EngineError, make_engine
from fp8check.harness.engines.cpu import perturbed, rollout, serving
from fp8check.harness.engines.cpu.perturbed import PerturbableRollout
from fp8check.harness.engines.cpu.rollout import ReferenceRollout
from fp8check.harness.engines.protocol import KNOBS
from fp8check.harness.sync.pipeline import run_sync


def test_the_mirror_declares_no_knobs_and_refuses_one():
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    eng = make_engine("rollout", "cpu-mirror", cfg)
    assert type(eng) is ReferenceRollout and eng.knobs == frozenset()
    with pytest.raises(EngineError, match="cannot inject"):
        eng.install([], 1, knobs={"post_process_repeats": 2})


def test_fp8checks_own_cpu_engine_is_the_perturbable_one():
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    eng = make_engine("rollout", "cpu-reference", cfg)
    assert isinstance(eng, PerturbableRollout) and eng.knobs == frozenset(KNOBS)
    with pytest.raises(EngineError, match="cannot inject"):
        eng.install([], 1, knobs={"no_such_knob": True})


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_no_knob_turned_is_the_mirror_bit_for_bit(model):
    cfg = recommended_config(model, "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    states, failed = [], []
    for name in ("cpu-mirror", "cpu-reference"):
        eng = make_engine("rollout", name, cfg)
        res = run_sync(cfg, trainer, eng, probes=False)
        failed.append([f.invariant_id for f in res.findings if f.verdict == "fail"])
        states.append(eng.kernel_tensors())
    assert failed[0] == []
    mirror, perturbable = states
    assert mirror.keys() == perturbable.keys()
    for n, t in mirror.items():
        u = perturbable[n]
        assert t.dtype == u.dtype and t.shape == u.shape, n
        assert torch.equal(t.reshape(-1).view(torch.uint8), u.reshape(-1).view(torch.uint8)), n
    assert failed[1] == []


# `logit_scale` is also numerics.forward.Weights' field (vLLM's LogitsProcessor.scale), which the mirror serves with
NUMERICS_NAMES = {"logit_scale"}


@pytest.mark.parametrize("module", [rollout, serving])
def test_the_mirrors_source_names_no_knob(module):
    """No knob in the mirror's strings or comments (no knob read, no knob vocabulary), none as a name either but
    the numerics' own field."""
    toks = list(tokenize.generate_tokens(io.StringIO(inspect.getsource(module)).readline))
    text = " ".join(t.string for t in toks if t.type in (tokenize.STRING, tokenize.COMMENT))
    names = {t.string for t in toks if t.type == tokenize.NAME}
    assert [k for k in KNOBS if k in text] == []
    assert [k for k in KNOBS if k in names and k not in NUMERICS_NAMES] == []
    assert "_knobs" not in names and "DEFAULT_KNOBS" not in names
    assert [k for k in KNOBS if k not in inspect.getsource(perturbed)] == []
