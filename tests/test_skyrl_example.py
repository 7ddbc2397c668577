"""examples/skyrl_fp8_sync: a user project that runs SkyRL 0.4.0's own serialized FP8 weight sync (loaded from its
downloaded wheel) under fp8check's pytest plugin and asserts what fp8check finds, model by model. Run as a user runs
it: `pytest examples/skyrl_fp8_sync` in a subprocess (its own conftest, the plugin from the `pytest11` entry point).
Without the wheel it skips, saying where to get it -- except with FP8CHECK_REQUIRE_SKYRL=1 (.ci/run downloads it),
where that fails."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.join("examples", "skyrl_fp8_sync")


def _why_not():
    """The example's own answer (skyrl_loader.why_not), read without putting the example on sys.path."""
    spec = importlib.util.spec_from_file_location("_skyrl_loader", os.path.join(ROOT, PROJECT, "skyrl_loader.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.why_not()


WHY = _why_not()


@pytest.mark.skipif(WHY is not None and os.environ.get("FP8CHECK_REQUIRE_SKYRL") != "1", reason=str(WHY))
def test_skyrl_fp8_sync_project():
    assert WHY is None, WHY
    # one torch thread, as every worker of the CPU suite has (tests/conftest.py)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", PROJECT, "-q", "-p", "no:cacheprovider", "-rs"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and not re.search(r"skipped|failed|error|xfail", summary), out[-3000:]
