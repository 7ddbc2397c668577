"""The engine as RL stacks run it, on the real engines: vLLM with CUDA graphs captured, an FP8 KV cache and sleep
mode, colocated with the Megatron-Core/TE trainer; the phase loop sync -> generate -> sleep (levels 1 and 2) ->
train step -> wake -> sync -> generate over 3 train steps, every phase checked, the cold-vs-warm differential
against a fresh engine, and every serving fault caught at the first sync or wake after it."""
from dataclasses import replace

import pytest

from fp8check.e2e.serving import SERVING_FAULTS, loop_ok, phase_loop
from fp8check.harness.config import recommended_config

from .conftest import record

pytestmark = pytest.mark.gpu


def serving(model):
    cfg = recommended_config(model, "blockwise-fp32")
    return replace(cfg, rollout=replace(cfg.rollout, kv_cache_dtype="fp8_e4m3", cuda_graphs=True, sleep_mode=True))


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_phase_loop_with_graphs_fp8_kv_and_sleep(ray_session, model):
    rep = phase_loop(serving(model), steps=3, levels=(1, 2), trainer="megatron", rollout="vllm", ray=True,
                     num_gpus=0.05, cold_engine="vllm")
    record("serving_phase_loop", model=model, report=rep)
    assert {f["fault"] for f in rep["faults"] if f["verdict"] == "caught"} == set(SERVING_FAULTS), rep["faults"]
    assert loop_ok(rep), [p for p in rep["phases"] if p["fired"] or p["unknown"]] + [rep["differential"]]
