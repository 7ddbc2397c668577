"""One verdict set for one sync: every case of the two user projects (examples/verl_fp8_rollout: verl 0.9.1's FP8
rollout; examples/skyrl_fp8_sync: SkyRL 0.4.0's serialized FP8 sync) run through the pytest plugin's checker into the
CPU mirror and into real vLLM 0.26, with the same learner: the verdict of every invariant must be the same.

Cases are grouped by engine configuration: one vLLM engine per group, released at the group's end. verl's cases
need verl 0.9.1 installed; SkyRL's its wheel (examples/skyrl_fp8_sync/wheels or $SKYRL_WHEEL); a case whose stack
is absent is skipped, saying which. MXFP8 is not here (vLLM 0.26 serves MXFP8 on sm100 only); the tiny-hybrid
models need Qwen3.5 to start in vLLM (their groups fail at engine start otherwise, naming vLLM's error)."""
import os
import sys

import pytest

from .conftest import record

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP32, POW2 = "blockwise-fp32", "blockwise-pow2"


def _path(example):
    p = os.path.join(ROOT, "examples", example)
    if p not in sys.path:
        sys.path.insert(0, p)


def verl_cases():
    """(group, config kwargs, [(case name, sync function)]) for the verl example, as its tests run them."""
    _path("verl_fp8_rollout")
    import verl_loader
    why = verl_loader.why_not()
    if why:
        return why, []
    import verl_sync
    out = []
    for model in ("tiny-dense", "tiny-rl", "tiny-moe", "tiny-hybrid"):
        for recipe in (FP32, POW2):
            syncs = [("rollout", verl_sync.verl_fp8_rollout)]
            if model == "tiny-moe":
                syncs.append(("ignoring", verl_sync.verl_fp8_rollout_ignoring("mlp.shared_expert_gate")))
            if recipe == FP32:
                syncs.append(("no_process_group", verl_sync.verl_fp8_rollout_no_process_group))
            out.append((f"verl-{model}-{recipe}", dict(model=model, recipe=recipe), [(n, lambda c, f=f: f)
                                                                                     for n, f in syncs]))
    return None, out


def skyrl_cases():
    _path("skyrl_fp8_sync")
    import skyrl_loader
    why = skyrl_loader.why_not()
    if why:
        return why, []
    import skyrl_sync
    from fp8check.harness.config import TrainerConfig
    from fp8check.harness.jobconfig.skyrl_spec import skyrl_exclusion
    from fp8check.harness.models import get_model
    out = []
    for model in ("tiny-hybrid", "tiny-hybrid-moe"):
        for recipe in (FP32, POW2):
            ex = tuple(skyrl_exclusion(get_model(model), "blockwise"))
            cases = [(f"fp8_param={p}", lambda c: skyrl_sync.sync_for(c), TrainerConfig(fp8_param=p))
                     for p in (False, True)]
            out.append((f"skyrl-{model}-{recipe}", dict(model=model, recipe=recipe, default_exclude=False, exclude=ex),
                        cases))
    return None, out


def _groups():
    import torch
    if not torch.cuda.is_available():      # (the gpu marker skips it; the examples are not imported here)
        return [pytest.param(None, None, None, id="no-cuda")]
    params = []
    for stack, make in (("verl", verl_cases), ("skyrl", skyrl_cases)):
        why, groups = make()
        if why:
            params.append(pytest.param(stack, None, None, marks=pytest.mark.skip(reason=why), id=stack))
        for gid, kw, cases in groups:
            params.append(pytest.param(stack, kw, cases, id=gid))
    return params


def verdicts(findings) -> dict:
    """Invariant -> its verdict over every finding (fail > unknown > pass)."""
    rank = {"fail": 2, "unknown": 1, "pass": 0}
    out: dict = {}
    for f in findings:
        v = str(f.verdict)
        if rank[v] >= rank.get(out.get(f.invariant_id, "pass"), 0):
            out[f.invariant_id] = v
    return out


def judged(config, trainer, engine, sync):
    from fp8check.harness.integrations.check import SyncCheckFailed
    from fp8check.harness.integrations.pytest_plugin import SyncChecker
    try:
        return verdicts(SyncChecker(config, trainer, engine)(sync))
    except SyncCheckFailed as e:
        return verdicts(e.findings)


@pytest.mark.parametrize("stack,kw,cases", _groups())
def test_cpu_mirror_and_vllm_give_the_same_verdicts(stack, kw, cases, engine, release):
    import torch
    from dataclasses import replace
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.registry import make_engine
    base = recommended_config(**kw)
    live = engine(base)
    diffs = []
    try:
        for case in cases:
            name, make_sync = case[0], case[1]
            config = replace(base, trainer=case[2]) if len(case) > 2 else base
            trainer = make_engine("trainer", "cpu-reference", config)
            trainer.optimizer_step()
            sync = make_sync(config)
            cpu = judged(config, trainer, make_engine("rollout", "cpu-reference", config), sync)
            gpu = judged(config, trainer, live, sync)
            record("example_verdicts", stack=stack, group=kw, case=name, cpu=cpu, vllm=gpu)
            if cpu != gpu:
                diffs.append((name, {k: (cpu.get(k), gpu.get(k)) for k in sorted(set(cpu) | set(gpu))
                                     if cpu.get(k) != gpu.get(k)}))
            torch.cuda.empty_cache()
    finally:
        release(live)
    assert not diffs, f"CPU mirror vs vLLM verdicts differ (invariant: (cpu, vllm)): {diffs}"
