"""check_sync on a user-constructed vllm.LLM carrying fp8check's worker extension, after syncs fp8check did not
perform (examples/check_own_job_vllm.py, in its own process: one vLLM engine, released when it exits)."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import record

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_check_sync_on_a_users_own_engine(tmp_path):
    out = tmp_path / "user.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "check_own_job_vllm.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=420)
    rep = json.loads(out.read_text()) if out.exists() else {"stderr": p.stderr[-3000:]}
    record("user_engine_check_sync", report=rep, rc=p.returncode)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    *correct, buggy = rep["runs"]
    assert len(correct) == 3
    for run in correct:                          # every verdict, every time: no fail, no unknown
        assert not run["fired"] and not run["unknown"], run
    assert "S2" in buggy["fired"]
    assert all(r["engine_state_unchanged"] for r in rep["runs"])
