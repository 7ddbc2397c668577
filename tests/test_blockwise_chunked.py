"""The tiled CPU reference (harness/formats/blockwise.py) against a frozen copy of the whole-tensor version it
replaced, byte for byte (atol=0), over >= 80 cases: shapes, dtypes, block shapes, scale modes, epsilon, special
values, leading expert dims, non-contiguous inputs, and tiny tile budgets that force many tiles and edge tiles."""
import itertools

import pytest
import torch

from fp8check.harness.formats import blockwise
from fp8check.harness.formats.bytes import as_bytes

# ---- frozen oracle: the whole-tensor implementation as of commit aa7e4f3 (blockwise/scaling/cast) ----
_INPUT_MAX = {torch.float32: torch.finfo(torch.float32).max, torch.bfloat16: torch.finfo(torch.bfloat16).max,
              torch.float16: torch.finfo(torch.float16).max}
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _old_block_amax(xb, dims):
    a = xb.float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.amax(dim=dims)


def _old_scale_from_amax(amax, fp8_max, pow2, amax_epsilon, input_dtype):
    amax = amax.float()
    if amax_epsilon > 0.0:
        amax = torch.maximum(amax, torch.full_like(amax, amax_epsilon))
    scale = torch.full_like(amax, fp8_max) / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, _INPUT_MAX[input_dtype]), scale)
    degenerate = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
    scale = torch.where(degenerate, torch.ones_like(scale), scale)
    if pow2:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)
    return scale


def _old_cast(y, fp8_dtype):
    m = _FP8_MAX[fp8_dtype]
    q = y.clamp(-m, m).to(fp8_dtype)
    nan = torch.isnan(y)
    if bool(nan.any()):
        qb = q.view(torch.uint8).clone()
        qb[nan] = 0x7F
        q = qb.view(fp8_dtype)
    return q


def _old_pad_blocks(x, block_shape):
    n, k = x.shape
    bn, bk = block_shape
    gn, gk = -(-n // bn), -(-k // bk)
    if (gn * bn, gk * bk) != (n, k):
        xp = torch.zeros((gn * bn, gk * bk), dtype=x.dtype, device=x.device)
        xp[:n, :k] = x
    else:
        xp = x
    return xp.reshape(gn, bn, gk, bk)


def old_quantize_blockwise(x, block_shape=(128, 128), *, pow2=False, amax_epsilon=0.0,
                           fp8_dtype=torch.float8_e4m3fn):
    if x.dim() > 2:
        parts = [old_quantize_blockwise(s, block_shape, pow2=pow2, amax_epsilon=amax_epsilon, fp8_dtype=fp8_dtype)
                 for s in x.reshape(-1, *x.shape[-2:])]
        q = torch.stack([p[0] for p in parts]).reshape(x.shape)
        s = torch.stack([p[1] for p in parts]).reshape(*x.shape[:-2], *parts[0][1].shape)
        return q, s
    n, k = x.shape
    xb = _old_pad_blocks(x, block_shape)
    amax = _old_block_amax(xb, (1, 3))
    scale = _old_scale_from_amax(amax, _FP8_MAX[fp8_dtype], pow2, amax_epsilon, x.dtype)
    y = xb.float() * scale[:, None, :, None]
    q = _old_cast(y, fp8_dtype).reshape(xb.shape[0] * xb.shape[1], xb.shape[2] * xb.shape[3])[:n, :k]
    return q.contiguous(), (torch.ones_like(scale) / scale).contiguous()
# ---- end of the frozen oracle ----


def make(shape, dtype, kind, seed):
    """Adversarial inputs: per-block magnitudes, specials, subnormals, all-NaN blocks, overflow-prone scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    if kind == "wide":
        x = x * 10.0 ** torch.empty(shape).uniform_(-30, 30, generator=g).round()
    elif kind == "special":
        flat[::97] = float("nan")
        flat[5::211] = float("inf")
        flat[7::223] = -float("inf")
        flat[11::37] = torch.finfo(torch.float32).tiny / 7          # fp32 subnormal
        flat[13::41] = 448.0
        flat[17::43] = -0.0
        x.view(-1, shape[-1])[: min(3, x.shape[-2])] = 0.0
    elif kind == "tiny":
        x = x * 1e-38
    elif kind == "nanrows":                                           # whole rows / blocks of NaN
        x.view(-1, shape[-1])[::2] = float("nan")
    elif kind == "huge":
        x = x * 1e37
    elif kind == "negative":
        x = -x.abs()
    finfo = torch.finfo(dtype)
    if kind in ("special", "nanrows"):
        return x.to(dtype)
    return x.clamp(-finfo.max, finfo.max).to(dtype)


SHAPES = [(1, 1), (1, 300), (127, 129), (128, 128), (130, 260), (257, 385), (3, 140, 200)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
KINDS = ["normal", "wide", "special", "tiny", "nanrows", "huge", "negative"]
BLOCKS = [(128, 128), (1, 128), (32, 64)]
MODES = [(False, 0.0), (True, 0.0), (False, 1e-3), (True, 1e-6)]


def _cases():
    out = []
    for i, (shape, dtype, kind) in enumerate(itertools.product(SHAPES, DTYPES, KINDS)):
        if dtype == torch.float16 and kind in ("wide", "tiny", "huge"):
            continue
        block = BLOCKS[i % len(BLOCKS)]
        pow2, eps = MODES[(i // len(BLOCKS)) % len(MODES)]
        out.append((shape, dtype, kind, block, pow2, eps, i))
    return out


CASES = _cases()


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def test_enough_cases():
    assert len(CASES) >= 80


@pytest.mark.parametrize("tile", [None, 1 << 12], ids=["default-tile", "tiny-tile"])
def test_tiled_reference_is_byte_identical_to_whole_tensor_version(tile, monkeypatch):
    if tile is not None:                     # many tiles and edge tiles even on small tensors
        monkeypatch.setitem(blockwise.TILE_ELEMS, "cpu", tile)
    bad = []
    for shape, dtype, kind, block, pow2, eps, seed in CASES:
        x = make(shape, dtype, kind, seed)
        want = old_quantize_blockwise(x, block, pow2=pow2, amax_epsilon=eps)
        got = blockwise.quantize_blockwise(x, block, pow2=pow2, amax_epsilon=eps)
        if not (_same(got[0], want[0]) and _same(got[1], want[1])):
            bad.append((shape, str(dtype), kind, block, pow2, eps))
    assert not bad, f"{len(bad)}/{len(CASES)} cases differ: {bad[:5]}"


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
def test_multi_tile_tensor_and_noncontiguous_and_e5m2(block):
    x = make((1100, 1030), torch.bfloat16, "wide", 1)         # > one default tile for both block shapes
    for inp in (x, x.t(), x[::2, 3:]):
        for kw in ({}, {"pow2": True}, {"fp8_dtype": torch.float8_e5m2}):
            assert all(map(_same, blockwise.quantize_blockwise(inp, block, **kw),
                           old_quantize_blockwise(inp, block, **kw))), (inp.shape, kw)


def test_pad_blocks_public_name():
    assert blockwise._pad_blocks is blockwise.pad_blocks
    xb = blockwise.pad_blocks(torch.ones(3, 5), (2, 4))
    assert xb.shape == (2, 2, 2, 4) and float(xb.sum()) == 15.0
