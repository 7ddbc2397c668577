"""Pre-flight imports no torch: on a laptop `import torch` alone is 2.5-2.9 s, over pre-flight's 2 s budget
(docs/preflight.md). Each case runs the real CLI in a fresh interpreter in which importing torch raises; its output
must equal the output of a normal run (so no rule was skipped for want of torch)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = r"""
import sys, importlib.abc
tried = []
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            tried.append(name)          # an attempt counts even where the caller catches the ImportError
            raise ImportError("torch imported on the pre-flight path")
sys.meta_path.insert(0, NoTorch())
from fp8check.harness.cli import main
rc = main(sys.argv[1:])
if tried or "torch" in sys.modules:
    sys.stderr.write("torch import attempted on the pre-flight path\n")
    sys.exit(99)
sys.exit(rc)
"""
NORMAL = "import sys; from fp8check.harness.cli import main; sys.exit(main(sys.argv[1:]))"
# a machine without an NVIDIA driver: `--gpu auto` must resolve "no GPU" without torch
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

CASES = [
    ["preflight", "examples/skyrl_hopper_fp8.yaml", "--gpu", "sm90", "--json"],
    ["preflight", "examples/skyrl_hopper_fp8.yaml", "--json"],
    ["preflight", "examples/skyrl_blackwell_mxfp8.yaml", "--gpu", "sm100", "-v"],
    ["preflight", "examples/verl_fp8_rollout.yaml", "--json"],
    ["preflight", "examples/nemo_rl_fp8_generation.yaml", "--json"],
    ["preflight", "examples/skyrl_hopper_fp8.yaml", "--model", "qwen3-8b", "--gpu", "sm90", "--json"],
    ["preflight", "--explain", "E3", "examples/skyrl_hopper_fp8.yaml", "--gpu", "sm90"],
    ["preflight", "examples/skyrl_hopper_fp8.yaml", "--set", "trainer.policy.megatron_config.tensor_model_parallel_size=3"],
    ["preflight", "no/such/job.yaml"],
]


def _run(code, argv):
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a[1:3]))
def test_preflight_runs_without_torch(argv):
    from fp8check.harness.jobconfig import nvidia_driver_present
    if nvidia_driver_present() and "--gpu" not in argv:
        pytest.skip("this machine has an NVIDIA driver: `--gpu auto` asks torch which GPU is visible")
    blocked, normal = _run(BLOCK, argv), _run(NORMAL, argv)
    assert "Traceback" not in blocked.stderr and "internal error" not in blocked.stderr, blocked.stderr[-2000:]
    assert (blocked.returncode, blocked.stdout, blocked.stderr) == (normal.returncode, normal.stdout, normal.stderr)
    if "--json" in argv:
        assert json.loads(blocked.stdout)


def test_the_blocker_would_catch_a_torch_import(tmp_path):
    """The test above can fail: a command that needs torch dies under the same blocker."""
    r = _run(BLOCK, ["snapshot", "--model", "tiny-dense", "--out", str(tmp_path / "snap")])
    assert r.returncode != 0 and "torch imported on the pre-flight path" in r.stderr
