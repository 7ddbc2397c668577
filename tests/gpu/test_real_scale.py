"""Real shapes on one H200: Qwen3-8B and Qwen3-30B-A3B shapes (every per-layer shape real, depth cut to fit the
phase), the Megatron-Core/TE trainer and vLLM colocated, the device sync path (the weights GPU to GPU through CUDA
IPC, expected digests on the trainer's GPU, only mismatching parameters to a host), the whole catalog on clean
syncs, and live faults at that size: scales, GQA q/k/v interleaving at real head counts, expert permutation at
128 experts, coverage, post-load."""
from dataclasses import replace

import pytest

from fp8check.e2e.live import LiveSession
from fp8check.faults import FAULTS, real_shape_faults
from fp8check.harness.config import recommended_config
from fp8check.harness.models import with_layers

from .conftest import record

pytestmark = pytest.mark.gpu

# the Megatron/TE adapter builds no gated delta-net layer: Qwen3.5 runs with fp8check's TE-exact learner on the GPU
TRAINER = {"qwen3.5-9b": "cpu-reference", "qwen3.5-35b-a3b": "cpu-reference"}


@pytest.mark.parametrize("model,layers", [("qwen3-8b", 4), ("qwen3-30b-a3b", 2), ("qwen3.5-9b", 4),
                                          ("qwen3.5-35b-a3b", 2)])
def test_real_shape_catalog_and_faults_on_the_device_path(ray_session, model, layers):
    name = with_layers(model, layers)
    cfg = recommended_config(name, "blockwise-fp32")
    cfg = replace(cfg, trainer=replace(cfg.trainer, device=True))
    rep = {"model": name, "syncs": [], "faults": []}
    with LiveSession(cfg, trainer=TRAINER.get(model, "megatron"), device=True, num_gpus=0.1,
                     rollout_kwargs={"gpu_memory_utilization": 0.25}) as s:
        rep["start_seconds"] = s.start_seconds
        for _ in range(2):
            s.step()
            rep["syncs"].append(s.sync(f"step {s.version}", probes=True).to_json())
        for f in real_shape_faults(model):
            o = s.sync(f, fault=FAULTS[f])
            again = s.sync(f"clean after {f}")
            rep["faults"].append({"fault": f, "must_trip": list(FAULTS[f].trips), "fired": o.fired,
                                  "seconds": o.seconds, "again_fired": again.fired, "again_unknown": again.unknown})
    record("real_scale", **rep)
    for sy in rep["syncs"]:
        assert not sy["fired"] and not sy["unknown"], sy
        assert sy["fetched_params"] == 0
    for f in rep["faults"]:
        assert set(f["fired"]) & set(f["must_trip"]), f
        assert not f["again_fired"] and not f["again_unknown"], f
