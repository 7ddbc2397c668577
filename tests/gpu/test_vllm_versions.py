"""The vLLM release the host runs, through the adapter's version facts (harness.engines.vllm_api), in its own
process (one vLLM engine, released when it exits; phase `versions`):

* every release: the engine names its release, declares its reload, and a clean sync with FP8 KV cache is green
  (S1-S7, R1); where the release has vLLM's trainer-side transfer (0.27+), the same through
  rollout.install=weight_source;
* where the release has vLLM's weight checker (0.32+): vLLM's own checksums equal fp8check's mirror over the same
  engine's parameters, and the two oracles side by side -- a KV-scale placeholder (vLLM's round trip matches, R1
  fails) and a stale layer from the sender (vLLM's round trip matches, S2 fails)."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import record

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, os, sys
from dataclasses import replace
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import fp8check
from fp8check.faults import FAULTS
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.engines.vllm import VLLMEngine
from fp8check.harness.engines.vllm_api import engine_facts
from fp8check.harness.engines.vllm_checksum import compare_checksums, snapshot_checksums
from fp8check.harness.sync.pipeline import DigestFirst, run_sync
facts = engine_facts()
IDS = ["S1", "S2", "S3", "S4", "S5", "S6", "S7", "R1"]
base = fp8check.recommended_config("tiny-dense", "blockwise-fp32")
base = replace(base, rollout=replace(base.rollout, kv_cache_dtype="fp8_e4m3"))
out = {"vllm": facts.version, "verified": facts.verified, "runs": {}}
installs = ["reload"] + (["weight_source"] if facts.trainer_transfer else [])
for inst in installs:
    cfg = replace(base, rollout=replace(base.rollout, install=inst))
    eng = VLLMEngine(cfg, enforce_eager=True)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    res = run_sync(cfg, trainer, eng, capture=DigestFirst(), probes=False, check_ids=IDS)
    run = {"engine": res.rollout.meta.engine, "reload": res.rollout.meta.reload.mode, "fired": res.fired,
           "unknown": sorted({f.invariant_id for f in res.findings if f.verdict == "unknown"})}
    if inst == "reload" and facts.weight_checksums:
        vllm_cs = eng.weight_checksums()
        mirror = snapshot_checksums({n: t for n, t in eng.kernel_tensors().items()})
        run["mirror_equals_vllm"] = compare_checksums(mirror, vllm_cs)
        trainer.optimizer_step()
        previous = lambda: trainer.export_hf_at(trainer.step - 1)
        for name in ("kv_scale_placeholder", "stale_layer_unstamped"):
            f = FAULTS[name]
            r1 = run_sync(cfg, trainer, eng, fault=f, previous=previous, probes=False, check_ids=IDS)
            baseline = eng.weight_checksums()
            eng.reset_weights()
            run_sync(cfg, trainer, eng, fault=f, previous=previous, poison=False, resync=False, checks=False,
                     master=False)
            run[name] = {"fired": r1.fired, "vllm_compare": compare_checksums(eng.weight_checksums(), baseline)}
            eng.rpc("fp8check_pin_kv_scales", float(cfg.rollout.kv_scale))     # undo the placeholder
            run_sync(cfg, trainer, eng, probes=False, check_ids=IDS)      # a clean sync repairs the engine
    out["runs"][inst] = run
    eng.close()
print("RESULT " + json.dumps(out))
"""


def test_the_running_release_through_the_version_facts(tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=480)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    rep = json.loads(line[len("RESULT "):]) if line else {"stderr": p.stderr[-3000:]}
    record("vllm_versions", report=rep, rc=p.returncode)
    assert p.returncode == 0 and line, (p.stdout[-2000:], p.stderr[-3000:])
    import vllm
    from fp8check.harness.engines.vllm_api import facts_for
    facts = facts_for(vllm.__version__)
    assert set(rep["runs"]) == ({"reload", "weight_source"} if facts.trainer_transfer else {"reload"})
    for inst, run in rep["runs"].items():
        assert run["engine"] == f"vllm-{facts.version}" and run["reload"] == "layerwise", run
        assert not run["fired"] and not run["unknown"], (inst, run)
    if facts.weight_checksums:
        run = rep["runs"]["reload"]
        assert run["mirror_equals_vllm"] == {"match": True, "mismatches": []}, run["mirror_equals_vllm"]
        assert run["kv_scale_placeholder"]["vllm_compare"]["match"] and "R1" in run["kv_scale_placeholder"]["fired"]
        assert run["stale_layer_unstamped"]["vllm_compare"]["match"] and "S2" in run["stale_layer_unstamped"]["fired"]
