"""Transformer Engine 2.20's per-tensor delayed scaling (`DelayedScaling(margin=0, amax_history_len=1,
amax_compute_algo="most_recent")`, what Megatron-Core's `fp8_recipe="delayed"` builds) against fp8check's CPU
mirror (harness.formats.delayed) on a te.Linear: at every step the weight's FP8 bytes and scale_inv TE cast (read
from the module's workspace) and the scale TE holds after the autocast exit equal the mirror's, byte for byte,
while the weight grows between steps so that the delayed scale saturates codes (the seeds' failure in small)."""
import pytest
import torch

from fp8check.harness.formats.delayed import DelayedScaling

from .conftest import record

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("history,algo", [(1, "most_recent"), (4, "max")])
def test_te_delayed_scaling_weight_bytes_equal_the_mirror(history, algo):
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe
    fp8_autocast = getattr(te, "fp8_autocast", None)
    torch.manual_seed(0)
    lin = te.Linear(512, 1024, bias=False, params_dtype=torch.bfloat16).cuda()
    rec = te_recipe.DelayedScaling(margin=0, amax_history_len=history, amax_compute_algo=algo,
                                   fp8_format=te_recipe.Format.HYBRID)
    mirror, state = DelayedScaling(0, history, algo), DelayedScaling(0, history, algo).state()
    rows = []
    for step in range(6):
        w = lin.weight.detach().clone()
        x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        ctx = fp8_autocast(enabled=True, fp8_recipe=rec) if fp8_autocast else te.autocast(enabled=True, recipe=rec)
        with ctx:
            y = lin(x, is_first_microbatch=True)
        ws = lin._fp8_workspaces["weight"]
        codes, scale_inv = ws._data.view(torch.uint8).cpu(), ws._scale_inv.float().cpu().reshape(1)
        te_scale = lin.fp8_meta["scaling_fwd"].scale[1].float().cpu().reshape(1)
        m_codes, m_sinv = state.cast(w.cpu())
        state.update(mirror)
        rows.append({"step": step, "codes_differing": int((codes != m_codes.view(torch.uint8)).sum()),
                     "scale_inv_equal": bool(torch.equal(scale_inv, m_sinv)),
                     "scale_equal": bool(torch.equal(te_scale, state.scale)),
                     "saturated": int((m_codes.view(torch.uint8) & 0x7F).eq(0x7E).sum())})
        y.float().pow(2).mean().backward()
        with torch.no_grad():
            lin.weight.mul_(1.3).add_(lin.weight.grad, alpha=-1e-3)     # the amax grows: the stale scale saturates
            lin.weight.grad = None
    record("te_delayed_conformance", history=history, algo=algo, rows=rows)
    assert all(r["codes_differing"] == 0 and r["scale_inv_equal"] and r["scale_equal"] for r in rows), rows
    assert any(r["saturated"] for r in rows[1:]), rows          # the delayed scale did saturate codes
