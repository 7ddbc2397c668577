"""vLLM 0.26's online FP8 engines (a BF16 checkpoint started with `quantization="fp8"` -- one scale per fused
parameter, codes stored transposed -- or `"fp8_per_block"`) against fp8check's CPU mirror of them, through a
user's own engine: BF16 parameters synced by vLLM's reload_weights, then (1) the installed bytes in checkpoint
coordinates equal `online_engine_state_hf` of what was sent, parameter for parameter, and (2) `check_sync` on that
engine is clean (the settings are read from the engine: C10 compares the method by name). One engine per case, in
its own process."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import record

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, os, sys, tempfile
from dataclasses import replace
model, quant = sys.argv[1], sys.argv[2]
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import torch
import fp8check
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.engines.vllm import VLLM_ONLINE_QUANTIZATION, engine_env, write_model_dir
from fp8check.harness.engines.wire import decode
from fp8check.harness.numerics.online import online_engine_state_hf
base = fp8check.recommended_config(model, "blockwise-fp32")
cfg = replace(base, rollout=replace(base.rollout, quantization=quant))
os.environ.update(engine_env(cfg))
import vllm
llm = vllm.LLM(model=write_model_dir(cfg, tempfile.mkdtemp()), quantization=VLLM_ONLINE_QUANTIZATION[quant],
               load_format="dummy", enforce_eager=True, gpu_memory_utilization=0.15, max_model_len=256,
               skip_tokenizer_init=True, dtype="bfloat16", attention_backend="TRITON_ATTN",
               worker_extension_cls=fp8check.WORKER_EXTENSION)
fp8check.watch(llm)
learner = make_engine("trainer", "cpu-reference", cfg)
out = {"model": model, "quantization": quant, "runs": []}
for _ in range(2):
    learner.optimizer_step()
    sent = {n: t.bfloat16() for n, t in learner.master_hf().items()}
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [(n, t.cuda()) for n, t in sent.items()],
                                                 "is_checkpoint_format": True})
    got = cfg.layout.vllm_to_hf(cfg.layout.ranks_to_params([decode(e) for e in llm.collective_rpc("fp8check_read")]))
    want = online_engine_state_hf(cfg, sent)
    def same(a, b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    differing = sorted(n for n in want if n in got and not same(got[n], want[n]))
    missing = sorted(n for n in want if n not in got)
    findings = fp8check.check_sync(llm, sent, cfg, on_fail="return", version=learner.step)
    out["runs"].append({"compared": len(want), "differing": differing[:8], "n_differing": len(differing),
                        "missing": missing[:8],
                        "fired": sorted({f.invariant_id for f in findings if f.verdict == "fail"}),
                        "unknown": sorted({f.invariant_id for f in findings if f.verdict == "unknown"}),
                        "first": [f"{f.invariant_id} {f.tensor}: {f.message}" for f in findings
                                  if f.verdict != "pass"][:4]})
out["settings"] = llm.collective_rpc("fp8check_settings")[0]
print(json.dumps(out))
"""

CASES = [("tiny-dense", "online-per-tensor"), ("tiny-moe", "online-per-tensor"), ("tiny-dense", "online-per-block")]


@pytest.mark.parametrize("model,quant", CASES, ids=[f"{m}-{q}" for m, q in CASES])
def test_online_engine_bytes_equal_the_cpu_mirror_and_check_sync_is_clean(tmp_path, model, quant):
    f = tmp_path / "online_engine.py"
    f.write_text(SCRIPT)
    p = subprocess.run([sys.executable, str(f), model, quant], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    record("online_engine_conformance", **rep)
    for run in rep["runs"]:
        assert run["compared"] > 0 and run["n_differing"] == 0 and not run["missing"], run
        assert not run["fired"], run
    assert rep["settings"]["quant_methods"], rep["settings"]
