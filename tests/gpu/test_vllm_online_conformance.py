"""harness.numerics.online against vLLM 0.26's own functions on the GPU, byte for byte: the per-block cast the
naive sync runs in the engine (`vllm.utils.deep_gemm.per_block_cast_to_fp8`) and the dynamic per-tensor quant of
`quantization="fp8"` (`vllm._custom_ops.scaled_fp8_quant`), on weights without outliers (so x / s and
x * (1 / s) round differently somewhere: the test tells the two rules apart, which the 2026-12-01 dump could not)."""
import pytest
import torch

from fp8check.harness.numerics.online import per_block_cast_to_fp8, scaled_fp8_quant_per_tensor

from .conftest import record

pytestmark = pytest.mark.gpu
SHAPES = [(1024, 512), (3072, 1024), (1000, 520), (303, 300)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_online_rules_match_vllm(shape):
    from vllm import _custom_ops as ops
    from vllm.utils.deep_gemm import per_block_cast_to_fp8 as vllm_block
    g = torch.Generator().manual_seed(shape[0])
    w = (torch.randn(*shape, generator=g) * 0.03).bfloat16()
    vq, vs = vllm_block(w.cuda().float(), block_size=[128, 128], use_ue8m0=False)
    hq, hs = per_block_cast_to_fp8(w.float())
    block_codes = int((vq.cpu().view(torch.uint8) != hq.view(torch.uint8)).sum())
    block_scales = int((vs.cpu() != hs).sum())
    tq, ts = ops.scaled_fp8_quant(w.cuda(), scale=None)
    pq, ps = scaled_fp8_quant_per_tensor(w)
    tensor_codes = int((tq.cpu().view(torch.uint8) != pq.view(torch.uint8)).sum())
    rounding_differs = bool(((w.float() / ps).to(torch.float8_e4m3fn).view(torch.uint8)
                             != (w.float() * (1.0 / ps)).to(torch.float8_e4m3fn).view(torch.uint8)).any())
    record("vllm_online_conformance", shape=list(shape), block_codes=block_codes, block_scales=block_scales,
           tensor_codes=tensor_codes, tensor_scale_equal=float(ts) == float(ps), rounding_differs=rounding_differs)
    assert block_codes == block_scales == 0
    assert tensor_codes == 0 and float(ts) == float(ps)
