"""Machines without Triton: harness.formats and harness.digest import and work on CPU; only the Triton entry
points fail, with an ImportError that says what to use instead (a subprocess with `triton` made unimportable)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = """
import sys
sys.modules["triton"] = None                      # `import triton` now raises ImportError
import torch
import fp8check.harness.formats, fp8check.harness.digest, fp8check.harness.digest_triton, fp8check.harness.formats.triton_blockwise
from fp8check import harness
from fp8check.harness.formats import quantize_blockwise, quantize_blockwise_triton
quantize_blockwise(torch.ones(4, 4))
print(harness.digest.state_digest(torch.ones(3)))
for fn, args in ((quantize_blockwise_triton, (torch.ones(4, 4),)),
                 (harness.digest_triton.lane_sums_batched, ([torch.ones(3)],))):
    try:
        fn(*args)
    except ImportError as e:
        print("ImportError:", e)
"""


def test_import_without_triton_raises_only_when_called():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("fx:float32:3:")
    assert lines[1].startswith("ImportError: quantize_blockwise_triton needs Triton")
    assert "use harness.formats.quantize_blockwise" in lines[1]
    assert lines[2].startswith("ImportError: harness.digest_triton needs Triton")
