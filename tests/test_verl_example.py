"""examples/verl_fp8_rollout: a user project that runs verl 0.9.1's own FP8 rollout sync (imported from the
installed verl package) under fp8check's pytest plugin and asserts what fp8check finds, model by model. Run as a
user runs it: `pytest examples/verl_fp8_rollout` in a subprocess (its own conftest, the plugin from the
`pytest11` entry point)."""
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.join("examples", "verl_fp8_rollout")
VERL = "0.9.1"


def _verl_version():
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_verl_version() != VERL,
                    reason=f"verl {VERL} is not installed (found {_verl_version()}): pip install --no-deps verl=={VERL}")
def test_verl_fp8_rollout_project():
    # one torch thread, as every worker of the CPU suite has (tests/conftest.py): beside another busy worker on a
    # 2-core runner, OpenMP's spinning threads make the same run about ten times slower
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", PROJECT, "-q", "-p", "no:cacheprovider", "-rs"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and not re.search(r"skipped|failed|error|xfail", summary), out[-3000:]
