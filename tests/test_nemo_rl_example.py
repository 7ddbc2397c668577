"""examples/nemo_rl_fp8_generation: a user project that runs NeMo RL's FP8 generation refit, NeMo RL's own quantizer
(executed from its source at the pinned commit) on the engine's load path, under fp8check's pytest plugin, and
asserts what fp8check finds. Run as a user runs it: `pytest examples/nemo_rl_fp8_generation` in a subprocess.
NeMo RL's fp8.py is vendored unmodified in third_party/nemo_rl (its README names the commit)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.join("examples", "nemo_rl_fp8_generation")
sys.path.insert(0, os.path.join(ROOT, PROJECT))
import nemo_rl_loader  # noqa: E402

WHY = nemo_rl_loader.why_not()


@pytest.mark.skipif(WHY is not None, reason=str(WHY))
def test_nemo_rl_fp8_generation_project():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", PROJECT, "-q", "-p", "no:cacheprovider", "-rs"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and not re.search(r"skipped|failed|error|xfail", summary), out[-3000:]
