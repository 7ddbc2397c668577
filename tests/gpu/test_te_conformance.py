"""harness.formats vs Transformer Engine's Float8BlockQuantizer, byte for byte (atol=0, rtol=0)."""
import pytest
import torch

from fp8check.harness.formats.bytes import as_bytes
from fp8check.harness.formats import quantize_blockwise

from .conftest import record

pytestmark = pytest.mark.gpu

SHAPES = [(1024, 512), (1000, 520), (303, 300), (128, 128), (130, 260), (2048, 2048)]


def _case(shape, dtype, kind, seed):
    g = torch.Generator().manual_seed(seed)
    n, k = shape
    x = torch.randn(shape, generator=g)
    if kind == "wide":                       # every 128x128 block at its own magnitude, 1e-30 .. 1e30
        mag = 10.0 ** torch.empty((-(-n // 128), -(-k // 128))).uniform_(-30, 30, generator=g)
        x = x * mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    elif kind == "special":                  # zero block, NaN, +-inf, denormals, exact 448 multiples
        x[:128, :128] = 0
        x[0, 200 % k] = float("nan")
        x[min(130, n - 1), 5] = float("inf")
        x[min(131, n - 1), 6] = -float("inf")
        x[-1, :64] = torch.finfo(torch.float32).tiny / 7
        x[-2, :8] = 448.0
    elif kind == "tiny":
        x = x * 1e-38
    finfo = torch.finfo(dtype)
    return x.clamp(-finfo.max, finfo.max).to(dtype) if kind != "special" else x.to(dtype)


CASES = [(s, d, kind) for s in SHAPES for d in (torch.bfloat16, torch.float32, torch.float16)
         for kind in ("normal", "wide", "special", "tiny") if not (d == torch.float16 and kind in ("wide", "tiny"))]


def _bits_equal(a, b):
    return a.shape == b.shape and torch.equal(as_bytes(a), as_bytes(b))


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32", "pow2"])
@pytest.mark.parametrize("eps", [0.0, 1e-3], ids=["eps0", "eps1e-3"])
@pytest.mark.parametrize("block_dim", [2, 1], ids=["128x128", "1x128"])
def test_blockwise_quantizer_matches_transformer_engine(pow2, eps, block_dim):
    from fp8check.harness.engines.te_megatron import te_quantize_blockwise
    block = (128, 128) if block_dim == 2 else (1, 128)
    bad, n = [], 0
    for i, (shape, dtype, kind) in enumerate(CASES):
        x = _case(shape, dtype, kind, i)
        codes, s, ccodes, cs, _ = te_quantize_blockwise(x.cuda(), pow2=pow2, amax_epsilon=eps, block_scaling_dim=block_dim)
        q, sr = quantize_blockwise(x, block, pow2=pow2, amax_epsilon=eps)
        n += 1
        ok = _bits_equal(codes, q) and _bits_equal(s, sr)
        if block_dim == 2 and ccodes is not None:      # columnwise copy: the transpose, same blocks
            ok = ok and _bits_equal(ccodes, q.t()) and _bits_equal(cs, sr)
        if block_dim == 1 and ccodes is not None:      # columnwise 1x128 blocks run down the columns
            qt, st = quantize_blockwise(x.t().contiguous(), block, pow2=pow2, amax_epsilon=eps)
            ok = ok and _bits_equal(ccodes, qt) and _bits_equal(cs.t().contiguous() if cs.shape != st.shape else cs, st)
        if not ok:
            dc = int((as_bytes(codes) != as_bytes(q)).sum()) if codes.shape == q.shape else -1
            ds = int((as_bytes(s) != as_bytes(sr)).sum()) if s.shape == sr.shape else -1
            bad.append({"shape": shape, "dtype": str(dtype), "kind": kind, "codes_differ": dc, "scales_differ": ds,
                        "te_scale_shape": list(s.shape), "ref_scale_shape": list(sr.shape)})
    record("te_quantizer_conformance", pow2=pow2, eps=eps, block_dim=block_dim, cases=n, mismatching=bad[:10],
           n_bad=len(bad))
    assert not bad, f"{len(bad)}/{n} cases differ from Transformer Engine: {bad[:3]}"
