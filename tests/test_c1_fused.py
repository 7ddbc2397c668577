"""C1 through the fused requantize-and-compare kernel (what a GPU runs; here in Triton's interpreter) gives the
findings of the quantize-then-compare path, message and evidence included, on clean syncs and on the faults C1
exists for."""
import dataclasses
import json
from functools import partial

import pytest

import fp8check.invariants.contract as contract
from fp8check.faults import FAULTS
from fp8check.harness.config import recommended_config
from fp8check.harness.sync.pipeline import fault_config, reference_sync
from fp8check.invariants import REGISTRY, run_catalog, run_invariant

try:
    from triton_interp import load
except ImportError:
    from tests.triton_interp import load

CELLS = [(None, "tiny-dense", "blockwise-fp32"), (None, "tiny-moe", "blockwise-pow2"),
         ("trainer_epsilon_mismatch", "tiny-dense", "blockwise-fp32"),
         ("trainer_fp8_workspace_stale", "tiny-moe", "blockwise-pow2")]


@pytest.mark.parametrize("name,model,recipe", CELLS, ids=[f"{n or 'clean'}-{m}-{r}" for n, m, r in CELLS])
def test_fused_c1_finds_what_the_torch_path_finds(name, model, recipe):
    """`fused=True` puts the CPU masters through the kernel (by default only a GPU's masters take it)."""
    load("fp8check.harness.formats.triton_requantize")
    fault = FAULTS[name] if name else None
    cfg = fault_config(recommended_config(model, recipe), fault)
    res, _, _ = reference_sync(cfg, fault=fault, checks=False)
    ctx = res.context()
    text = lambda fs: [json.dumps(f.to_json(), sort_keys=True, default=str) for f in fs]    # noqa: E731
    want = text(run_catalog(ctx, ids=["C1"]))
    assert contract._fused_flags(res.context()) == {}                  # the production default on CPU masters
    assert set(contract._fused_flags(res.context(), fused=True)) == {n for n in cfg.trainer_fp8_tensors}
    c1 = dataclasses.replace(REGISTRY["C1"], check=partial(contract.c1_recipe, fused=True))
    got = text(run_invariant(c1, res.context()))
    assert got == want
    if fault is not None:
        assert any('"verdict": "fail"' in g for g in got)
