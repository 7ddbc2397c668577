"""Exactness of harness.formats against independent scalar oracles (Python floats + numpy float32, one IEEE
rounding per step, e4m3 encoded bit by bit), atol=0. The GPU suite proves the same functions against
Transformer Engine itself (tests/gpu/test_te_conformance.py)."""
import bisect
import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from fp8check.harness import strategies as fst
from fp8check.harness.formats import (dequantize_blockwise, e8m0_to_float, float_to_e8m0, get_recipe, quantize_blockwise,
                             quantize_mxfp8, quantize_per_tensor, scale_from_amax, te_to_wire, wire_to_te)

F32 = np.float32


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


_E4M3 = [((m / 8) * 2.0 ** -6 if (c >> 3) == 0 else (1 + m / 8) * 2.0 ** ((c >> 3) - 7))
         for c in range(0x7F) for m in [c & 7]]           # value of every positive code, increasing


def e4m3_byte(y: float) -> int:
    """Independent E4M3 (fn) encoder: round-to-nearest-even on the value grid, saturate to 448, NaN -> 0x7F."""
    if math.isnan(y):
        return 0x7F
    sign = 0x80 if (y < 0 or (y == 0 and math.copysign(1, y) < 0)) else 0
    a = min(abs(y), 448.0)
    i = bisect.bisect_left(_E4M3, a)
    if i == len(_E4M3):
        return sign | 0x7E
    if _E4M3[i] == a or i == 0:
        return sign | i
    lo, hi = _E4M3[i - 1], _E4M3[i]
    if a - lo < hi - a:
        return sign | (i - 1)
    if hi - a < a - lo:
        return sign | i
    return sign | (i if i % 2 == 0 else i - 1)          # tie: the even code


def oracle_block(x: np.ndarray, pow2: bool, eps: float, input_max: float):
    """TE rule for one block of float32 values: (codes bytes, scale_inv float)."""
    vals = [float(v) for v in x.reshape(-1)]
    amax = max([abs(v) for v in vals if not math.isnan(v)] + [0.0])
    amax = F32(amax)
    if eps > 0 and amax < F32(eps):
        amax = F32(eps)
    if amax == 0 or math.isinf(amax):
        scale = F32(1.0)
    else:
        with np.errstate(over="ignore"):
            scale = F32(448.0) / amax
        if math.isinf(scale):
            scale = F32(input_max)
    if pow2:
        scale = F32(bits_f32(f32_bits(float(scale)) & 0xFF800000))
    with np.errstate(over="ignore"):
        codes = [e4m3_byte(float(F32(v) * scale)) for v in vals]
    return codes, float(F32(1.0) / scale)


@pytest.mark.parametrize("pow2", [False, True])
@given(w=fst.weights(shape=fst.shapes(max_side=140)), eps=st.sampled_from([0.0, 1e-6, 1e-2]))
def test_blockwise_matches_scalar_oracle(pow2, w, eps):
    q, s = quantize_blockwise(w, pow2=pow2, amax_epsilon=eps)
    x = w.float().numpy()
    n, k = x.shape
    imax = float(torch.finfo(w.dtype).max)
    qb = q.view(torch.uint8).numpy()
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            blk = x[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            codes, sinv = oracle_block(blk, pow2, eps, imax)
            got = qb[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].reshape(-1).tolist()
            assert got == codes, (bi, bj)
            assert f32_bits(float(s[bi, bj])) == f32_bits(sinv), (bi, bj, float(s[bi, bj]), sinv)


def test_scale_is_one_correctly_rounded_division():
    """The PyTorch trap: `448.0 / amax` multiplies by a rounded reciprocal; the quantizer must not."""
    amax = torch.tensor([float(F32(v)) for v in np.random.default_rng(0).uniform(1e-3, 10, 20000)])
    exact = torch.tensor([float(F32(448.0) / F32(a)) for a in amax.tolist()])
    assert torch.equal(scale_from_amax(amax, 448.0), exact)
    assert not torch.equal(448.0 / amax, exact), "torch changed: scalar / tensor is now one rounding"


@pytest.mark.parametrize("amax,expected", [(0.0, 1.0), (float("inf"), 1.0), (float("nan"), 1.0), (448.0, 1.0),
                                            (1e-45, torch.finfo(torch.bfloat16).max)])
def test_degenerate_amax(amax, expected):
    s = scale_from_amax(torch.tensor([amax]), 448.0, input_dtype=torch.bfloat16)
    assert float(s[0]) == float(F32(expected))


def test_zero_block_and_nan_and_saturation():
    x = torch.zeros(256, 256)
    x[200, 200] = float("nan")
    x[130, 3] = float("inf")
    x[131, 4] = -1e30
    q, s = quantize_blockwise(x)
    assert float(s[0, 0]) == 1.0 and int(q.view(torch.uint8)[:128, :128].sum()) == 0
    assert int(q.view(torch.uint8)[200, 200]) == 0x7F
    assert int(q.view(torch.uint8)[130, 3]) == 0x7E and int(q.view(torch.uint8)[131, 4]) == 0xFE


@given(w=fst.weights(shape=fst.shapes(max_side=200), dtypes=(torch.float32, torch.bfloat16)))
def test_dequantize_error_within_half_ulp_of_block_scale(w):
    x = w.float()
    finite = torch.isfinite(x).all() and x.abs().max() < 1e30 and x.abs().max() > 1e-30
    if not finite:
        return
    q, s = quantize_blockwise(w)
    d = dequantize_blockwise(q, s)
    from fp8check.harness.formats import expand_scale
    # e4m3 spacing in the top binade is 32 code units: half is 16, plus the fp32 roundings of scale and scale_inv
    bound = expand_scale(s, x.shape) * (16 * (1 + 2 ** -18))
    assert bool(((d - x).abs() <= bound).all())


def e8m0_oracle(v: float) -> int:
    if math.isnan(v):
        return 0xFF
    if math.isinf(v):
        return 0xFE
    b = f32_bits(v)
    e, m = (b >> 23) & 0xFF, b & 0x7FFFFF
    if m > 0 and e != 0xFE and not (e == 0 and m <= 0x400000):
        e += 1
    return e


@given(st.one_of(st.floats(min_value=0, allow_infinity=True, width=32), st.just(float("nan"))))
def test_float_to_e8m0_matches_oracle(v):
    assert int(float_to_e8m0(torch.tensor([v], dtype=torch.float32))[0]) == e8m0_oracle(v)


@given(w=fst.weights(shape=st.tuples(st.integers(1, 40), st.integers(1, 100)), dtypes=(torch.float32, torch.bfloat16)))
def test_mxfp8_matches_oracle(w):
    q, s = quantize_mxfp8(w)
    x = w.float().numpy()
    rcp = F32(1.0 / 448.0)
    for i in range(x.shape[0]):
        for j in range(s.shape[1]):
            blk = x[i, j * 32:(j + 1) * 32]
            amax = F32(max([abs(float(v)) for v in blk if not math.isnan(v)] + [0.0]))
            e = e8m0_oracle(float(F32(amax * rcp)))
            assert int(s.view(torch.uint8)[i, j]) == e
            factor = 1.0 if e == 0 else bits_f32(max(254 - e, 0) << 23)
            want = [e4m3_byte(float(F32(F32(v) * F32(factor)))) for v in blk]
            assert q.view(torch.uint8)[i, j * 32:(j + 1) * 32].tolist() == want


@pytest.mark.parametrize("shape, scale_cols", [((5, 64), 2), ((5, 70), 3), ((3, 4, 96), 3), ((5, 64), 3),
                                               ((5, 64), 1)])
def test_mxfp8_dequantize_is_each_code_times_its_block_scale(shape, scale_cols):
    """codes x 2^(e - 127) per element, whole blocks (broadcast in place) or not, experts stacked; a scale grid of
    another width (a broken sync's) is read as the element-wise expansion reads it, or refused the same way."""
    from fp8check.harness.formats import dequantize_mxfp8
    from fp8check.harness.formats.blockwise import to_float
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.randint(100, 140, (*shape[:-1], scale_cols), generator=g, dtype=torch.uint8)
    scale.view(-1)[0] = 0xFF                                   # E8M0's NaN
    scale = scale.view(torch.float8_e8m0fnu)
    k = shape[-1]
    before = codes.view(torch.uint8).clone()
    try:
        want = to_float(codes) * e8m0_to_float(scale).repeat_interleave(32, -1)[..., :k]
    except RuntimeError:
        with pytest.raises(RuntimeError):
            dequantize_mxfp8(codes, scale)
        return
    got = dequantize_mxfp8(codes, scale)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(codes.view(torch.uint8), before)        # the codes were not scaled in place


def test_mxfp8_zero_block_byte_and_decode():
    q, s = quantize_mxfp8(torch.zeros(2, 64))
    assert s.view(torch.uint8).tolist() == [[0, 0], [0, 0]]
    assert e8m0_to_float(torch.tensor([127], dtype=torch.uint8))[0] == 1.0


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("columnwise", [False, True])
@given(shape=fst.shapes(max_side=700))
def test_te_layout_roundtrip(block_dim, columnwise, shape):
    n, k = shape
    block = (128, 128) if block_dim == 2 else (1, 128)
    if columnwise and block_dim == 1:
        grid = torch.randn(-(-n // 128), k)          # 1x128 blocks down the columns of the transposed data
    else:
        grid = torch.randn(-(-n // block[0]), -(-k // block[1]))
    te = wire_to_te(grid, block_dim, columnwise)
    assert te.shape[-1] % 4 == 0
    assert torch.equal(te_to_wire(te, (n, k), block_dim, columnwise), grid)


def test_te_padded_layout_example():
    s = torch.arange(8 * 5, dtype=torch.float32).reshape(8, 5)
    te = wire_to_te(s)
    assert list(te.shape) == [8, 8]                  # DESIGN: logical [8, 5] stored as [8, 8]


def test_per_tensor_and_recipes():
    x = torch.randn(64, 64)
    q, s = quantize_per_tensor(x)
    assert s.shape == (1,) and float(s[0]) == float(F32(1.0) / (F32(448.0) / F32(float(x.abs().max()))))
    with pytest.raises(ValueError):
        get_recipe("blockwise-fp64")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float32, torch.bfloat16])
def test_poison_fills_the_storage_behind_a_strided_view(dtype):
    """vLLM's online per-tensor layers are read (and poisoned) as the transpose of their stored codes, cut to the
    model's rows: the poison must reach the engine's storage, not a copy."""
    from fp8check.harness.formats.bytes import SENTINEL, is_sentinel, poison_
    stored = torch.zeros(16, 24).to(dtype)               # [K, N] as the kernel stores it, padded
    view = stored.t()[:20, :12]                          # [N, K] in checkpoint orientation, the model's part
    poison_(view)
    assert bool(is_sentinel(stored.t()[:20, :12]).all())
    assert not bool(is_sentinel(stored.t()[20:]).any()) and not bool(is_sentinel(stored.t()[:, 12:]).any())
    assert int((stored.view(torch.uint8) == SENTINEL).sum()) == 20 * 12 * stored.element_size()


def test_sentinel_flags_equal_any_sentinel_per_tensor():
    """S1's batched poison screen answers what any_sentinel answers for each tensor: every dtype width, empty
    tensors, strided views, a poison element in the last of several chunks, a generator input."""
    from fp8check.harness.formats import bytes as fb
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(7, 5, generator=g), torch.randn(4, 4, generator=g).bfloat16(), torch.zeros(0),
          torch.randint(0, 255, (33,), generator=g, dtype=torch.uint8), torch.randn(6, 9, generator=g).t(),
          torch.randn(10, generator=g).double()]
    poisoned = [t.clone() for t in ts]
    for t in poisoned:
        if t.numel():
            fb.poison_(t.reshape(-1)[-1:]) if t.is_contiguous() else fb.poison_(t[-1:, -1:])
    partial = torch.randn(8, generator=g)
    partial.view(torch.uint8)[1] = 0xFF          # one poison byte is not a poisoned element
    cases = ts + poisoned + [partial]
    codes = torch.randint(0, 255, (40,), generator=g, dtype=torch.uint8)
    codes[3] = 0xFE                               # the largest byte short of the poison one
    cases += [codes.view(torch.float8_e4m3fn), codes.clone().view(torch.float8_e8m0fnu)]
    cases[-1].view(torch.uint8)[17] = 0xFF        # one-byte elements: one poison byte is a poisoned element
    want = [fb.any_sentinel(t) for t in cases]
    assert want == [bool(fb.is_sentinel(t).any()) for t in cases]
    assert want.count(True) == 6                  # the non-empty poisoned ones
    assert fb.sentinel_flags(t for t in cases) == want
    old = fb.SCAN_CHUNK
    try:
        fb.SCAN_CHUNK = 4                         # several chunks per tensor: the hit is in a later one
        assert fb.sentinel_flags(cases) == want
    finally:
        fb.SCAN_CHUNK = old


def test_to_float_table_bit_identical_to_the_cast():
    """The fp8 -> fp32 table (two bytes per lookup where the layout allows, one otherwise) returns the cast's
    bits for every byte pair, NaN payloads included, and for odd, offset and strided views."""
    from fp8check.harness.formats.blockwise import to_float
    i = torch.arange(1 << 16, dtype=torch.int32)
    every_pair = torch.stack([i & 0xFF, i >> 8], 1).to(torch.uint8).reshape(-1)
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = every_pair.view(dt)
        for v in (t, t[1:], t[1:-1], t.view(256, 512)[:, ::2], t.view(256, 512).t(), t[:0], t.view(2, -1)[:, 1:3]):
            got = to_float(v)
            assert got.shape == v.shape and got.dtype == torch.float32
            assert torch.equal(got.view(torch.int32), v.float().view(torch.int32))
