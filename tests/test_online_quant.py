"""The engine-side (online) FP8 rules (harness.numerics.online) against what vLLM 0.26 installed on an H200, and
against the arithmetic each rule states. tests/gpu/test_vllm_online_conformance.py compares them with vLLM's own
functions on the GPU."""
import os

import pytest
import torch

from fp8check.harness.numerics.online import (E4M3_MAX, amax_over_448_blockwise, per_block_cast_to_fp8,
                                     per_token_activation_quant, scaled_fp8_quant_per_tensor)

DATA = os.path.join(os.path.dirname(__file__), "data", "vllm026_online_fp8_corner.pt")
MEASURED = torch.load(DATA, weights_only=False)["params"]


@pytest.mark.parametrize("param", sorted(MEASURED))
def test_online_per_tensor_fp8_is_what_vllm_installed(param):
    """quantization='fp8' on BF16 weights: one fp32 scale max|W| / 448 per fused parameter, the codes stored as the
    transpose ([K, N], a transposed view), each code e4m3(x * (1 / scale))."""
    m = MEASURED[param]
    assert float(m["weight_scale"]) == float(torch.tensor(m["amax"], dtype=torch.float32) / 448.0)
    k, n = m["shape_installed"]
    assert m["stride_installed"] == [1, k], "installed as the transpose of a contiguous [N, K]"
    q, s = scaled_fp8_quant_per_tensor(m["bf16_corner"], scale=m["weight_scale"])
    assert torch.equal(q.t().contiguous().view(torch.uint8), m["installed_corner"].view(torch.uint8))


def test_per_block_cast_follows_vllms_rule():
    """vLLM's per_block_cast_to_fp8 as it runs on CUDA (measured on the H200, ci/probe_per_block.py): amax clamped
    to 1e-4, sf = amax * fp32(1 / 448) (CUDA's tensor / scalar multiplies by the reciprocal), codes of
    x * (1 / sf)."""
    inv = torch.tensor(1.0 / 448.0, dtype=torch.float32)
    w = torch.zeros(256, 128)
    w[128:, :] = torch.linspace(-3.0, 3.0, 128 * 128).reshape(128, 128)
    q, s = per_block_cast_to_fp8(w)
    assert s.shape == (2, 1) and float(s[0, 0]) == float(torch.tensor(1e-4) * inv)
    assert int(q[:128].view(torch.uint8).count_nonzero()) == 0
    sf = torch.tensor(3.0) * inv
    want = (w[128:] * (1.0 / sf)).to(torch.float8_e4m3fn)
    assert float(s[1, 0]) == float(sf) and torch.equal(q[128:].view(torch.uint8), want.view(torch.uint8))


def test_the_senders_formula_divides_and_the_engines_multiplies():
    """Where x / s and x * (1 / s) round to different codes, each function keeps its own rule (E3's point)."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(512, 512, generator=g) * 0.02).bfloat16()
    qa, sa = amax_over_448_blockwise(w)
    qb, sb = per_block_cast_to_fp8(w)
    xv = w.float().reshape(4, 128, 4, 128)
    amax = xv.abs().amax(dim=(1, 3), keepdim=True)
    s_div, s_mul = amax / 448.0, amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    assert torch.equal(sa, s_div.reshape(4, 4)) and torch.equal(sb, s_mul.reshape(4, 4))
    assert not torch.equal(sa, sb)                 # the two scale rules differ in the last bit somewhere
    div = (xv / s_div).to(torch.float8_e4m3fn).reshape(512, 512)
    mul = (xv * (1.0 / s_mul)).to(torch.float8_e4m3fn).reshape(512, 512)
    assert torch.equal(qa.view(torch.uint8), div.view(torch.uint8))
    assert torch.equal(qb.view(torch.uint8), mul.view(torch.uint8))
    assert not torch.equal(qa.view(torch.uint8), qb.view(torch.uint8)), "pick data where the two rules differ"


def test_per_token_activations_have_their_own_scale_and_a_floor():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [448.0, 1.0, 2.0]])
    y = per_token_activation_quant(x)
    assert torch.equal(y[1], torch.zeros(3))                     # the floor keeps a zero row finite
    assert float(y[0, 1]) == -2.0 and float(y[2, 0]) == 448.0    # each row's amax maps to 448 and back
    assert float(E4M3_MAX) == 448.0
