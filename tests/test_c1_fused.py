"""C1 through the fused requantize-and-compare kernel (what a GPU runs; here in Triton's interpreter) gives the
findings of the quantize-then-compare path, message and evidence included, on clean syncs and on the faults C1
exists for."""
import json

import pytest

import fp8check.invariants.contract as contract
from fp8check.faults import FAULTS
from fp8check.harness.config import recommended_config
from fp8check.harness.sync.pipeline import fault_config, reference_sync
from fp8check.invariants import run_catalog

try:
    from triton_interp import load
except ImportError:
    from tests.triton_interp import load

CELLS = [(None, "tiny-dense", "blockwise-fp32"), (None, "tiny-moe", "blockwise-pow2"),
         ("trainer_epsilon_mismatch", "tiny-dense", "blockwise-fp32"),
         ("trainer_fp8_workspace_stale", "tiny-moe", "blockwise-pow2")]


@pytest.mark.parametrize("name,model,recipe", CELLS, ids=[f"{n or 'clean'}-{m}-{r}" for n, m, r in CELLS])
def test_fused_c1_finds_what_the_torch_path_finds(name, model, recipe, monkeypatch):
    load("fp8check.harness.formats.triton_requantize")
    fault = FAULTS[name] if name else None
    cfg = fault_config(recommended_config(model, recipe), fault)
    res, _, _ = reference_sync(cfg, fault=fault, checks=False)
    ctx = res.context()
    text = lambda fs: [json.dumps(f.to_json(), sort_keys=True, default=str) for f in fs]    # noqa: E731
    want = text(run_catalog(ctx, ids=["C1"]))
    monkeypatch.setattr(contract, "FUSED_ON_CPU", True)
    assert set(contract._fused_flags(res.context())) == {n for n in cfg.trainer_fp8_tensors}
    got = text(run_catalog(res.context(), ids=["C1"]))
    assert got == want
    if fault is not None:
        assert any('"verdict": "fail"' in g for g in got)
