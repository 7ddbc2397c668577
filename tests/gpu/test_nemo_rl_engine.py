"""NeMo RL's FP8 generation engine on vLLM 0.26 (`rollout.quantization=nemo-rl-blockwise`): vLLM started from the
block-FP8 checkpoint config NeMo RL builds, each BF16 tensor of two refits quantized by NeMo RL's rule and loaded
through vLLM's reload_weights. (1) The installed bytes in checkpoint coordinates equal
`online_engine_state_hf` of what was sent (NeMo RL's rule, fp8check's CPU re-statement), parameter for
parameter, after vLLM's own post-load step; (2) `check_sync` on that engine is clean; (3) where NeMo RL's fp8.py
is here (NEMO_RL_SRC: the file at 7ea279ab, or the cache `nemo_rl_loader --fetch` fills), NeMo RL's own
`cast_tensor_to_fp8_blockwise` run on CUDA gives the CPU re-statement's bytes, both scale modes (its
`amax / 448` is CUDA's multiply by the reciprocal there). One engine per case, in its own process."""
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
model, recipe = sys.argv[1], sys.argv[2]
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import torch
import fp8check
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.engines.vllm import engine_env, write_model_dir
from fp8check.harness.engines.wire import decode
from fp8check.harness.numerics.nemo_rl import cast_to_fp8_blockwise, load_weights
from fp8check.harness.numerics.online import online_engine_state_hf
base = fp8check.recommended_config(model, recipe)
cfg = replace(base, rollout=replace(base.rollout, quantization="nemo-rl-blockwise"))
os.environ.update(engine_env(cfg))
import vllm
llm = vllm.LLM(model=write_model_dir(cfg, tempfile.mkdtemp()), load_format="dummy", enforce_eager=True,
               gpu_memory_utilization=0.15, max_model_len=256, skip_tokenizer_init=True, dtype="bfloat16",
               attention_backend="TRITON_ATTN", worker_extension_cls=fp8check.WORKER_EXTENSION)
fp8check.watch(llm)
learner = make_engine("trainer", "cpu-reference", cfg)
out = {"model": model, "recipe": recipe, "runs": []}
pow2 = cfg.recipe.scale_format == "pow2"
nemo = None
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "nemo_rl_fp8_generation"))
try:
    import nemo_rl_loader
    nemo = nemo_rl_loader.load(pow2).cast_tensor_to_fp8_blockwise
except ImportError as e:
    out["nemo_rl_own"] = f"not run: {e}"
for _ in range(2):
    learner.optimizer_step()
    sent = {n: t.bfloat16() for n, t in learner.master_hf().items()}
    items = list(load_weights([(n, t.cuda()) for n, t in sent.items()], cfg.engine_fp8_tensors, cfg.engine_recipe))
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
    got = cfg.layout.vllm_to_hf(cfg.layout.ranks_to_params([decode(e) for e in llm.collective_rpc("fp8check_read")]))
    want = online_engine_state_hf(cfg, sent)
    def same(a, b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))
    differing = sorted(n for n in want if n in got and not same(got[n], want[n]))
    missing = sorted(n for n in want if n not in got)
    findings = fp8check.check_sync(llm, sent, cfg, on_fail="return", version=learner.step)
    run = {"compared": len(want), "differing": differing[:8], "n_differing": len(differing), "missing": missing[:8],
           "fired": sorted({f.invariant_id for f in findings if f.verdict == "fail"}),
           "first": [f"{f.invariant_id} {f.tensor}: {f.message}" for f in findings if f.verdict != "pass"][:4]}
    if nemo is not None:
        codes = scales = 0
        for n in cfg.fp8_tensor_names:
            q, s = nemo(sent[n].cuda().to(torch.float), weight_block_size=[128, 128])
            q2, s2 = cast_to_fp8_blockwise(sent[n], pow2=pow2)
            codes += int((q.cpu().view(torch.uint8) != q2.view(torch.uint8)).sum())
            scales += int((torch.squeeze(s, -1).cpu().view(torch.int32) != s2.view(torch.int32)).sum())
        run["nemo_rl_own_on_cuda"] = {"codes_differ": codes, "scales_differ": scales}
    out["runs"].append(run)
out["settings"] = llm.collective_rpc("fp8check_settings")[0]
print(json.dumps(out))
"""

CASES = [("tiny-dense", "blockwise-fp32"), ("tiny-dense", "blockwise-pow2"), ("tiny-moe", "blockwise-fp32")]


@pytest.mark.parametrize("model,recipe", CASES, ids=[f"{m}-{r}" for m, r in CASES])
def test_nemo_rl_engine_bytes_equal_the_cpu_rule_and_check_sync_is_clean(tmp_path, model, recipe):
    f = tmp_path / "nemo_rl_engine.py"
    f.write_text(SCRIPT)
    p = subprocess.run([sys.executable, str(f), model, recipe], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    record("nemo_rl_engine_conformance", **rep)
    for run in rep["runs"]:
        assert run["compared"] > 0 and run["n_differing"] == 0 and not run["missing"], run
        assert not run["fired"], run
        if os.environ.get("NEMO_RL_SRC"):         # asked for: NeMo RL's own function must have run
            assert "nemo_rl_own_on_cuda" in run, rep.get("nemo_rl_own")
        if "nemo_rl_own_on_cuda" in run:
            assert run["nemo_rl_own_on_cuda"] == {"codes_differ": 0, "scales_differ": 0}, run
    assert rep["settings"]["quant_methods"], rep["settings"]
