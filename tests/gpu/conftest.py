"""Fixtures for the GPU machine: engines behind the remote wrapper (Ray actors), started once per configuration
within a phase and released at its end, a check that every released engine's process is gone (so its GPU memory
is back), and a results file ($FP8CHECK_RESULTS, JSON lines) holding every measured figure the tests assert on.

Phases (ci/gpu_session.sh) run as separate pytest processes, each well inside 9 minutes, each printing its own
summary; a phase may share a Ray cluster with another (RAY_ADDRESS) or start its own."""
import json
import os
import time

import pytest

ENGINES: dict = {}
TRAINERS: dict = {}
CLOSED_PIDS: list = []


def record(name: str, **data):
    path = os.environ.get("FP8CHECK_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, "time": time.time(), **data}, default=str) + "\n")


def _key(config, extra=()) -> str:
    return json.dumps([config.to_dict(), list(extra)], sort_keys=True, default=str)


def _close(handle):
    pid = handle.pid()
    handle.close()
    CLOSED_PIDS.append(pid)


def _gone(pid: int, timeout: float = 90.0) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def ray_session():
    from fp8check.harness.engines.remote import start_ray
    ray = start_ray()
    yield ray
    for h in list(ENGINES.values()) + list(TRAINERS.values()):
        _close(h)
    ENGINES.clear()
    TRAINERS.clear()
    alive = [p for p in CLOSED_PIDS if not _gone(p)]
    record("engines_released", pids=CLOSED_PIDS, alive=alive)
    assert not alive, f"engine processes still alive after release (GPU memory not returned): {alive}"
    if os.environ.get("FP8CHECK_GPU_EXCLUSIVE") == "1":       # this phase ran alone: free memory is back
        import torch
        free, total = torch.cuda.mem_get_info()
        record("gpu_memory_after_phase", free_gib=round(free / 2 ** 30, 1), total_gib=round(total / 2 ** 30, 1))
        assert free > 0.9 * total, f"only {free / 2 ** 30:.1f} of {total / 2 ** 30:.1f} GiB free after the phase"


@pytest.fixture(scope="session")
def engine(ray_session):
    """engine(config, **kwargs) -> a vLLM rollout engine (Remote), started once per distinct configuration."""
    from fp8check.harness.engines.remote import Remote

    def get(config, **kw):
        key = _key(config, sorted(kw.items()))
        if key not in ENGINES:
            t0 = time.perf_counter()
            ENGINES[key] = Remote("rollout", "vllm", config, ray=True, num_gpus=0.05, **kw)
            record("engine_start", model=config.model, recipe=config.recipe.name, settings=dict(kw),
                   seconds=round(time.perf_counter() - t0, 1))
        return ENGINES[key]
    return get


@pytest.fixture(scope="session")
def release(ray_session):
    """release(handle): close an engine now (a phase that starts many engines keeps the card from filling)."""
    def rel(handle):
        for d in (ENGINES, TRAINERS):
            for k, v in list(d.items()):
                if v is handle:
                    del d[k]
        _close(handle)
    return rel


@pytest.fixture(scope="session")
def trainer(ray_session):
    """trainer(config, name="megatron") -> a trainer (Remote), one per (model, recipe, trainer settings)."""
    from fp8check.harness.engines.remote import Remote

    def get(config, name="megatron"):
        d = config.to_dict()
        key = json.dumps([{k: d[k] for k in ("model", "recipe", "trainer", "seed", "exclude")}, name],
                         sort_keys=True, default=str)
        if key not in TRAINERS:
            t0 = time.perf_counter()
            TRAINERS[key] = Remote("trainer", name, config, ray=True, num_gpus=0.05)
            record("trainer_start", model=config.model, recipe=config.recipe.name, trainer=name,
                   seconds=round(time.perf_counter() - t0, 1))
        return TRAINERS[key]
    return get
