import os

import pytest
import torch

# CPU suite: one thread per xdist worker (2-core CI)
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Without CUDA, Triton kernels run in Triton's interpreter; it must be chosen before triton is first imported
# (torch.compile imports it too), see tests/triton_interp.py
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _gpu_stack() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    for mod in ("vllm", "transformer_engine", "megatron.core", "ray"):
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001 - any import failure means the stack is not usable
            return f"{mod} not importable ({e.__class__.__name__})"
    return None


def pytest_collection_modifyitems(config, items):
    why = _gpu_stack() if any("gpu" in i.keywords for i in items) else None
    if why:
        skip = pytest.mark.skip(reason=f"gpu test: {why}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# Hypothesis: CI runs derandomized (reproducible); locally full randomness.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
