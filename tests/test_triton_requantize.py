"""C1's fused re-quantize-and-compare (harness/formats/triton_requantize.py) against its definition,
`not (bits_equal(q, codes) and bits_equal(s, scale))` with `(q, s)` the CPU reference quantizer's bytes: under
TRITON_INTERPRET=1 on CPU tensors (compiled where CUDA is present), property-style over shapes, values, recipes,
layouts and single-bit corruptions, and for a flipped bit in one tensor of a batch, flagged for that tensor only.
Its sm90 PTX is read in tests/test_triton_quantizer.py."""
import inspect
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fp8check.harness.formats import quantize_blockwise
from fp8check.harness.formats.bytes import bits_equal

try:                                 # pytest puts tests/ on sys.path (rootdir conftest, no tests/__init__.py)
    from triton_interp import load
except ImportError:                  # imported from the repository root
    from tests.triton_interp import load

rq, DEVICE = load("fp8check.harness.formats.triton_requantize")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _values(shape, dtype, kind, seed):
    """A master of `kind`: normal; wide (every 16x16 patch at its own magnitude, 1e-30 .. 1e30); special (a zero
    block, +-NaN, +-inf, fp32-subnormal and exact-448 values); tiny (all amax under an epsilon of 1e-3)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    n, k = shape[-2:]
    if kind == "wide":
        mag = 10.0 ** torch.empty((*shape[:-2], -(-n // 16), -(-k // 16))).uniform_(-30, 30, generator=g)
        x = x * mag.repeat_interleave(16, -2).repeat_interleave(16, -1)[..., :n, :k]
    elif kind == "special":
        x[..., : min(n, 128), : min(k, 128)] = 0
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (6,), generator=g)
        flat[idx[0]], flat[idx[1]] = float("nan"), -float("nan")
        flat[idx[2]], flat[idx[3]] = float("inf"), -float("inf")
        flat[idx[4]], flat[idx[5]] = torch.finfo(torch.float32).tiny / 7, 448.0
    elif kind == "tiny":
        x = x * 1e-6
    if dtype != torch.float32:
        m = torch.finfo(dtype).max
        x = torch.where(torch.isfinite(x), x.clamp(-m, m), x)
    return x.to(dtype)


def _layout(x, how):
    """The same values in another memory layout (a view of a bigger or permuted buffer)."""
    if how == "transposed":                    # unit row stride: the strided launch group
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "offset":                        # one element in: unit column stride, not 16-byte aligned
        buf = torch.empty(x.numel() + 1, dtype=x.dtype)
        buf[1:] = x.reshape(-1)
        return buf[1:].view(x.shape)
    if how == "padded":                        # rows of a wider buffer: a pitch that is not the width
        buf = torch.zeros((*x.shape[:-1], x.shape[-1] + 16), dtype=x.dtype)
        buf[..., : x.shape[-1]] = x
        return buf[..., : x.shape[-1]]
    return x


def _reference(master, block, pow2, eps, fp8):
    return quantize_blockwise(master, block, pow2=pow2, amax_epsilon=eps, fp8_dtype=fp8)


def _definition(master, codes, scale, block, pow2, eps, fp8):
    q, s = _reference(master, block, pow2, eps, fp8)
    return not (bits_equal(q, codes) and (scale is None or bits_equal(s, scale)))


def _flip(t, index, bit):
    """A copy of t in the same layout with one bit of element `index` (flat, in logical order) flipped."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    out.copy_(t)
    v = out.view({1: torch.uint8, 4: torch.int32}[t.element_size()])
    pos = tuple(int(i) for i in torch.unravel_index(torch.tensor(index), t.shape))
    v[pos] = v[pos] ^ ((1 << bit) if bit < 31 else -(1 << 31))
    return out


def _on_device(t):
    """t on the kernel's device with its strides and storage offset kept (the layout under test)."""
    if DEVICE == "cpu":
        return t
    st = t.untyped_storage()
    whole = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.nbytes() // t.element_size(),), (1,))
    return whole.to(DEVICE).as_strided(t.shape, t.stride(), t.storage_offset())


def _run(masters, codes, scales, block, pow2=False, eps=0.0, fp8=E4M3, variant=None):
    flags = rq.requantize_mismatch([_on_device(m) for m in masters], [_on_device(q) for q in codes],
                                   [None if s is None else _on_device(s) for s in scales], block, pow2=pow2,
                                   amax_epsilon=eps, fp8_dtype=fp8, variant=variant)
    assert flags.dtype == torch.bool and flags.device.type == DEVICE and flags.shape == (len(masters),)
    return flags.cpu().tolist()


MODES = [(pow2, eps, block) for pow2 in (False, True) for eps in (0.0, 1e-3) for block in ((128, 128), (1, 128))]

tensor_case = st.fixed_dictionaries({
    "shape": st.one_of(st.tuples(st.integers(1, 290), st.integers(1, 290)),
                       st.tuples(st.integers(2, 3), st.integers(1, 140), st.integers(1, 140))),
    "dtype": st.sampled_from([torch.bfloat16, torch.float32, torch.float16]),
    "kind": st.sampled_from(["normal", "wide", "special", "tiny"]),
    "layout": st.sampled_from(["contiguous", "transposed", "offset", "padded"]),
    "corrupt": st.sampled_from([None, None, "code", "scale", "no-scale", "scale-dtype"]),
    "seed": st.integers(0, 2 ** 16),
})


@settings(max_examples=30, deadline=None)
@given(cases=st.lists(tensor_case, min_size=1, max_size=4), mode=st.sampled_from(MODES))
def test_flags_are_the_definition(cases, mode):
    """Batches of masters (any dtype, shape, layout, values) with the reference bytes, some corrupted by one
    bit: each flag equals `not (bits_equal(q, codes) and bits_equal(s, scale))`."""
    pow2, eps, block = mode
    masters, codes, scales, want = [], [], [], []
    for c in cases:
        x = _values(c["shape"], c["dtype"], c["kind"] if c["dtype"] != torch.float16 or c["kind"] != "wide"
                    else "normal", c["seed"])
        m = _layout(x, c["layout"])
        q, s = _reference(m, block, pow2, eps, E4M3)
        g = torch.Generator().manual_seed(c["seed"])
        if c["corrupt"] == "code":
            q = _flip(q, int(torch.randint(0, q.numel(), (1,), generator=g)), int(torch.randint(0, 8, (1,), generator=g)))
        elif c["corrupt"] == "scale":
            s = _flip(s, int(torch.randint(0, s.numel(), (1,), generator=g)), int(torch.randint(0, 32, (1,), generator=g)))
        elif c["corrupt"] == "no-scale":
            s = None
        elif c["corrupt"] == "scale-dtype":
            s = s.double()
        masters.append(m)
        codes.append(_layout(q, c["layout"]) if q.dim() >= 2 and c["layout"] == "transposed" else q)
        scales.append(s)
        want.append(_definition(m, codes[-1], s, block, pow2, eps, E4M3))
    assert _run(masters, codes, scales, block, pow2, eps) == want


def _batch():
    """Five masters of different dtypes, shapes and layouts (one per launch group), with the reference bytes."""
    g = torch.Generator().manual_seed(21)
    return [_values((130, 260), torch.bfloat16, "special", 1),                      # aligned, ragged
            (torch.randn(256, 128, generator=g) * 1e-3).float(),                     # fp32, whole blocks
            _values((2, 129, 140), torch.bfloat16, "wide", 2),                       # an expert stack
            _layout(_values((140, 200), torch.bfloat16, "normal", 3), "transposed"), # strided
            _layout(_values((100, 130), torch.float32, "special", 4), "offset")]     # unit stride, unaligned


@pytest.mark.parametrize("block,pow2,eps", [((128, 128), False, 0.0), ((1, 128), True, 1e-3)],
                         ids=["128x128-fp32", "1x128-pow2-eps"])
def test_one_flipped_bit_is_flagged_for_its_tensor_only(block, pow2, eps):
    masters = _batch()
    ref = [_reference(m, block, pow2, eps, E4M3) for m in masters]
    codes, scales = [q for q, _ in ref], [s for _, s in ref]
    assert _run(masters, codes, scales, block, pow2, eps) == [False] * 5
    g = torch.Generator().manual_seed(4)
    for i in range(5):
        q, s = codes[i], scales[i]
        # even tensors: the last element (a partial edge block where the shape is ragged) and a scale's sign bit;
        # odd ones: random elements and bits
        index = q.numel() - 1 if i % 2 == 0 else int(torch.randint(0, q.numel(), (1,), generator=g))
        bit = int(torch.randint(0, 8, (1,), generator=g))
        bad = codes[:i] + [_flip(q, index, bit)] + codes[i + 1:]
        assert _run(masters, bad, scales, block, pow2, eps) == [j == i for j in range(5)], (i, index, bit)
        index = s.numel() - 1 if i % 2 == 0 else int(torch.randint(0, s.numel(), (1,), generator=g))
        bit = 31 if i % 2 == 0 else int(torch.randint(0, 31, (1,), generator=g))
        bad = scales[:i] + [_flip(s, index, bit)] + scales[i + 1:]
        assert _run(masters, codes, bad, block, pow2, eps) == [j == i for j in range(5)], (i, index, bit)


def test_nan_is_0x7f_whatever_its_sign():
    """TE writes NaN as 0x7F: the trainer's 0xFF for a -NaN master element is a mismatch."""
    m = torch.randn(130, 140).bfloat16()
    m[5, 7], m[129, 139] = -float("nan"), float("nan")
    for block in ((128, 128), (1, 128)):
        q, s = _reference(m, block, False, 0.0, E4M3)
        assert q.view(torch.uint8)[5, 7] == 0x7F
        assert _run([m], [q], [s], block) == [False]
        bad = q.clone()
        bad.view(torch.uint8)[5, 7] = 0xFF
        assert _run([m], [bad], [s], block) == [True]


def test_a_shape_or_dtype_that_differs_is_a_mismatch_and_none_compares_codes_only():
    m = torch.randn(130, 260).bfloat16()
    q, s = _reference(m, (128, 128), False, 0.0, E4M3)
    cases = [(q, s, False), (q.view(torch.uint8).view(E5M2), s, True), (q[:129], s, True), (q, s[:, :1], True),
             (q, s.bfloat16(), True), (q, s.double(), True), (q, None, False), (_flip(q, 3, 2), None, True),
             (q, _flip(s, 0, 5).float(), True)]
    got = _run([m] * len(cases), [c[0] for c in cases], [c[1] for c in cases], (128, 128))
    assert got == [c[2] for c in cases]
    # e5m2 recipes: the codes' dtype is the recipe's
    q5, s5 = _reference(m, (128, 128), False, 0.0, E5M2)
    assert _run([m, m], [q5, q], [s5, s], (128, 128), fp8=E5M2) == [False, True]


@pytest.mark.parametrize("block", [(256, 128), (100, 60), (32, 64), (1, 100)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_other_block_shapes(block):
    """A block larger than one tile (walked in slices), non-power-of-two and small blocks."""
    masters = [_values((300, 260), torch.bfloat16, "special", 5), _values((129, 131), torch.float32, "wide", 6)]
    ref = [_reference(m, block, True, 0.0, E4M3) for m in masters]
    codes, scales = [q for q, _ in ref], [s for _, s in ref]
    assert _run(masters, codes, scales, block, pow2=True) == [False, False]
    assert _run(masters, [codes[0], _flip(codes[1], codes[1].numel() // 2, 7)], scales, block, pow2=True) == \
        [False, True]
    assert _run(masters, codes, [_flip(scales[0], scales[0].numel() - 1, 30), scales[1]], block, pow2=True) == \
        [True, False]


@pytest.mark.parametrize("variant", sorted(rq.tb.VARIANTS))
def test_every_launch_variant(variant):
    masters = _batch()[:3]
    ref = [_reference(m, (128, 128), False, 0.0, E4M3) for m in masters]
    codes, scales = [q for q, _ in ref], [s for _, s in ref]
    assert _run(masters, codes, scales, (128, 128), variant=variant) == [False] * 3
    assert _run(masters, [codes[0], codes[1], _flip(codes[2], 5, 1)], scales, (128, 128), variant=variant) == \
        [False, False, True]


def test_empty_and_single_element_masters():
    ms = [torch.zeros(0, 128).bfloat16(), torch.tensor([[3.0]]), torch.zeros(130, 0)]
    ref = [_reference(m, (128, 128), False, 0.0, E4M3) for m in ms]
    assert _run(ms, [q for q, _ in ref], [s for _, s in ref], (128, 128)) == [False, False, False]
    assert _run(ms[:1], [ref[0][0]], [ref[2][1]], (128, 128)) == [True]        # an empty grid of another shape
    assert _run(ms[1:2], [_flip(ref[1][0], 0, 0)], [ref[1][1]], (128, 128)) == [True]
    assert rq.requantize_mismatch([], [], []).shape == (0,)


def test_bad_arguments():
    m = torch.randn(4, 4)
    q, s = _reference(m, (128, 128), False, 0.0, E4M3)
    with pytest.raises(ValueError, match="one of each"):
        rq.requantize_mismatch([m], [q], [])
    with pytest.raises(ValueError, match="2D"):
        rq.requantize_mismatch([torch.randn(4)], [q], [s])
    with pytest.raises(ValueError, match="dtype"):
        rq.requantize_mismatch([m.double()], [q], [s])


def test_one_source_of_the_rounding_rule():
    """The requantize kernel quantizes through the quantizer's own jit helpers and has no arithmetic of its own
    for the scale or the cast (no division, no fp8 conversion, no encoder)."""
    src = inspect.getsource(rq._requantize_kernel.fn) + inspect.getsource(rq._differs.fn)
    for helper in ("tb._tile_amax", "tb._has_nan", "tb._scale", "tb._tile_codes", "tb._f32_bits", "tb._sliced_amax"):
        assert helper in src, helper
    assert not re.search(r"div_rn|float8|_fp8_encode|_fp8_codes|448|0x7E|0x7F\b", src)
