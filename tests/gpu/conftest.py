"""Fixtures for the GPU machine: one Ray session, engines started once per configuration and shared, and a
results file ($FP8CHECK_RESULTS, JSON lines) holding every measured figure the tests assert on."""
import json
import os
import tempfile
import time

import pytest

ENGINES: dict = {}
TRAINERS: dict = {}


def record(name: str, **data):
    path = os.environ.get("FP8CHECK_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, "time": time.time(), **data}, default=str) + "\n")


@pytest.fixture(scope="session")
def ray_session():
    from harness.ray_workers import RayWire, start_ray
    start_ray()
    yield RayWire
    RayWire.shutdown()


@pytest.fixture(scope="session")
def workdir():
    return tempfile.mkdtemp(prefix="fp8check-gpu-")


@pytest.fixture(scope="session")
def engine(ray_session, workdir):
    """engine(config, ignored_layers=None) -> Ray rollout worker, started once per distinct configuration."""
    from harness.ray_workers import rollout_actor

    def get(config, ignored_layers=None):
        key = (json.dumps(config.to_dict(), sort_keys=True, default=str), tuple(ignored_layers or ()))
        if key not in ENGINES:
            t0 = time.perf_counter()
            a = rollout_actor(config, workdir, num_gpus=0.1, ignored_layers=ignored_layers)
            info = ray_session.get(a.ready.remote())
            record("engine_start", model=config.model, recipe=config.recipe.name, env=info["env"],
                   seconds=round(time.perf_counter() - t0, 1))
            ENGINES[key] = a
        return ENGINES[key]
    return get


@pytest.fixture(scope="session")
def trainer(ray_session):
    from harness.ray_workers import trainer_actor

    def get(config, source="megatron"):
        # one trainer per (model, recipe, trainer settings): the rollout side of the config does not matter to it
        d = config.to_dict()
        key = (json.dumps({k: d[k] for k in ("model", "recipe", "trainer", "seed", "exclude")}, sort_keys=True,
                          default=str), source)
        if key not in TRAINERS:
            t0 = time.perf_counter()
            a = trainer_actor(config, num_gpus=0.1, fp8_source=source)
            info = ray_session.get(a.info.remote())
            record("trainer_start", model=config.model, recipe=config.recipe.name, info=info,
                   seconds=round(time.perf_counter() - t0, 1))
            TRAINERS[key] = a
        return TRAINERS[key]
    return get
