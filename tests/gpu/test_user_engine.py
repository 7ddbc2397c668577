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


def _readme_snippet(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location("readme_snippets", os.path.join(ROOT, "tests", "readme_snippets.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.snippet(name)


def test_the_readme_vllm_snippet_runs_verbatim(tmp_path):
    """README "Check your own job": the snippet as written, in its own process (one vLLM engine)."""
    f = tmp_path / "snippet.py"
    f.write_text(_readme_snippet("vllm"))
    p = subprocess.run([sys.executable, str(f)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    passed = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    record("readme_vllm_snippet", rc=p.returncode, passed=passed, stderr=p.stderr[-1500:])
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    assert passed == str(sorted(["C10", "S1", "S2", "S3", "S4", "S5", "S6", "S7"])), passed


ENGINE_WITHOUT_ENV = r"""
import json, os, sys, tempfile
for k in ("VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0"):
    os.environ.pop(k, None)                      # vLLM 0.26's defaults, as a user's own engine gets them
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_DEEP_GEMM_WARMUP="skip")   # start-up only, not judged
import fp8check
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.engines.vllm import write_model_dir
import vllm
config = fp8check.recommended_config("tiny-dense", "blockwise-fp32")
llm = vllm.LLM(model=write_model_dir(config, tempfile.mkdtemp()), load_format="dummy", enforce_eager=True,
               gpu_memory_utilization=0.15, max_model_len=256, skip_tokenizer_init=True, dtype="bfloat16",
               attention_backend="TRITON_ATTN",
               worker_extension_cls=fp8check.WORKER_EXTENSION)
fp8check.watch(llm)
learner = make_engine("trainer", "cpu-reference", config)
learner.optimizer_step()
expected = learner.export_hf()
llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [(n, t.cuda()) for n, t in expected.items()],
                                             "is_checkpoint_format": True})
settings = llm.collective_rpc("fp8check_settings")[0]
findings = fp8check.check_sync(llm, expected, config, on_fail="return")
fails = [[f.invariant_id, f.tensor, f.message] for f in findings if f.verdict == "fail"]
print(json.dumps({"settings": settings, "fails": fails[:6], "fired": sorted({f[0] for f in fails})}))
"""


def test_an_engine_started_without_engine_env_is_c10_naming_the_variable(tmp_path):
    """A user's vllm.LLM with vLLM's default environment on the H200 (DeepGEMM with E8M0 on) under the config's
    FP32 block scales: the settings are read from the engine, and the first finding is C10 naming the variable."""
    f = tmp_path / "engine_without_env.py"
    f.write_text(ENGINE_WITHOUT_ENV)
    p = subprocess.run([sys.executable, str(f)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    record("engine_without_engine_env", **rep)
    assert rep["settings"]["ue8m0_in_use"] is True, rep["settings"]
    assert rep["fails"][0][0] == "C10" and "VLLM_USE_DEEP_GEMM_E8M0=1" in rep["fails"][0][2], rep
