"""The Triton blockwise quantizer (harness/formats/triton_blockwise.py) against the CPU reference, byte for byte
(atol=0 on the uint8 / int32 views): under TRITON_INTERPRET=1 on CPU tensors, or compiled where CUDA is present.

The interpreter runs the kernel's integer and fp32 operations with numpy; what the interpreter cannot show (that
the GPU build keeps `div.rn.f32`, adds no flush-to-zero and no FMA) is checked on the sm90 PTX that Triton
compiles here without a GPU (test_sm90_ptx_keeps_ieee_operations), and on the H200 by
tests/gpu/test_triton_conformance.py."""
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tokenize

import pytest
import torch

from fp8check.harness.formats import quantize_blockwise
from fp8check.harness.formats.bytes import as_bytes

try:                                 # pytest puts tests/ on sys.path (rootdir conftest, no tests/__init__.py)
    from gpu.test_te_conformance import _case
    from triton_interp import load
except ImportError:                  # imported from the repository root
    from tests.gpu.test_te_conformance import _case
    from tests.triton_interp import load

tb, DEVICE = load("fp8check.harness.formats.triton_blockwise")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = [(pow2, eps, block) for pow2 in (False, True) for eps in (0.0, 1e-3) for block in ((128, 128), (1, 128))]
MODE_IDS = [f"{'pow2' if p else 'fp32'}-eps{e:g}-{b[0]}x{b[1]}" for p, e, b in MODES]
# the conformance generator of tests/gpu/test_te_conformance.py on shapes the interpreter gets through quickly
# (both ragged in both dims); each mode runs all dtype x kind cases on one of them
SHAPES = [(130, 260), (257, 129)]
KINDS = [(d, kind) for d in (torch.bfloat16, torch.float32, torch.float16)
         for kind in ("normal", "wide", "special", "tiny")
         if not (d == torch.float16 and kind in ("wide", "tiny"))]
FAST = {"rows_per_program": 128, "slice_rows": 128}       # fewer, larger interpreted steps; same bytes


def _diff(got, want):
    """Number of differing bytes of codes and scales (-1: shape or dtype differs)."""
    out = []
    for g, w in zip(got, want):
        out.append(int((as_bytes(g) != as_bytes(w)).sum()) if (g.shape, g.dtype) == (w.shape, w.dtype) else -1)
    return tuple(out)


def _check(x, block, pow2=False, eps=0.0, fp8_dtype=torch.float8_e4m3fn, view=None, **knobs):
    """(differing code bytes, differing scale bytes) of the kernel vs the reference; `view` is applied after
    the move to the kernel's device, so strides and storage offsets survive it."""
    view = view or (lambda t: t)
    want = quantize_blockwise(view(x), block, pow2=pow2, amax_epsilon=eps, fp8_dtype=fp8_dtype)
    xd = view(x.to(DEVICE))
    got = [t.cpu() for t in tb.launch(xd, block, pow2=pow2, amax_epsilon=eps, fp8_dtype=fp8_dtype, **knobs)]
    if not knobs:                                                   # the public entry point: the same launch
        pub = tb.quantize_blockwise_triton(xd, block, pow2=pow2, amax_epsilon=eps, fp8_dtype=fp8_dtype)
        assert _diff([t.cpu() for t in pub], want) == (0, 0)
    return _diff(got, want)


@pytest.mark.parametrize("pow2,eps,block,shape", [(*m, SHAPES[i % 2]) for i, m in enumerate(MODES)], ids=MODE_IDS)
def test_conformance_cases_match_reference(pow2, eps, block, shape):
    bad = []
    for i, (dtype, kind) in enumerate(KINDS):
        d = _check(_case(shape, dtype, kind, i), block, pow2, eps, **FAST)
        if d != (0, 0):
            bad.append((shape, str(dtype), kind, d))
    assert not bad, f"{len(bad)}/{len(KINDS)} cases differ (codes, scales bytes): {bad[:4]}"


@pytest.mark.parametrize("pow2,eps,block", MODES[::3], ids=MODE_IDS[::3])
def test_gpu_launch_configuration_matches_reference(pow2, eps, block):
    """The default variant's knobs (what runs on the H200), on a ragged shape (masks) and a whole one (EVEN)."""
    for i, dtype in enumerate((torch.bfloat16, torch.float32)):
        assert _check(_case((130, 260), dtype, "special", i), block, pow2, eps) == (0, 0), dtype
        assert _check(_case((256, 384), dtype, "wide", i), block, pow2, eps) == (0, 0), dtype


@pytest.mark.parametrize("variant", sorted(tb.VARIANTS))
def test_every_launch_variant_gives_the_reference_bytes(variant):
    """Each candidate the H200 bench times (persistent or not, one tile or two-pass slices): ragged and whole
    shapes, NaN / inf / zero blocks, both block kinds, both scale modes, an expert stack."""
    g = torch.Generator().manual_seed(11)
    cases = [(_case((130, 260), torch.bfloat16, "special", 1), (128, 128), False),
             (_case((256, 256), torch.bfloat16, "wide", 2), (128, 128), True),
             (_case((257, 129), torch.float32, "special", 3), (1, 128), True),
             (_case((64, 384), torch.bfloat16, "normal", 4), (1, 128), False),
             ((torch.randn(3, 128, 256, generator=g) * 3).bfloat16(), (128, 128), False)]
    for x, block, pow2 in cases:
        assert _check(x, block, pow2, variant=variant) == (0, 0), (tuple(x.shape), block, pow2)


def test_hardware_cast_path_writes_nan_code_whatever_the_sign():
    """The GPU build's NaN handling (a block holding NaN takes the second tail, which writes 0x7F over the
    conversion's NaN code), run here through the interpreter's float8 cast on values it encodes exactly (fp8
    normals, scale 1: every block's amax is 448), so that only the NaN select decides the NaN bytes."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    normals = grid[torch.isfinite(grid) & (grid.abs() >= 2.0 ** -6)]
    x = normals[torch.randint(0, normals.numel(), (256, 256), generator=torch.Generator().manual_seed(5))]
    x[:, ::128] = 448.0                                      # every block, 128x128 or 1x128, has amax 448
    x[3, 5], x[4, 6], x[200, 130] = float("nan"), -float("nan"), -float("nan")
    for block in ((128, 128), (1, 128)):
        q, s = (t.cpu() for t in tb.launch(x.to(DEVICE), block, hw_cast=True))
        want = quantize_blockwise(x, block)
        assert _diff((q, s), want) == (0, 0), block
        assert q.view(torch.uint8)[4, 6] == 0x7F and q.view(torch.uint8)[200, 130] == 0x7F


def _encoder_probe(fp8_max: float):
    """fp32 values at every fp8 rounding boundary, +-1 ulp, exact ties, subnormals, +-0, values past the fp8 max,
    NaN, random bit patterns.  Every 128x128 block also holds +inf, so amax = inf and scale = 1: the kernel's
    integer cast sees these values unchanged."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn if fp8_max == 448.0 else torch.float8_e5m2)
    v = grid.float()
    v = v[torch.isfinite(v) & (v >= 0)].unique()                    # every finite non-negative fp8 value
    mids = (v[1:] + v[:-1]) / 2                                      # exact ties in fp32
    base = torch.cat([v, mids, torch.tensor([fp8_max * 1.03, fp8_max * 1.0625, 1e30, 1e-30, 1e-45, 3e38])])
    bits = base.view(torch.int32)
    near = torch.cat([bits - 1, bits, bits + 1]).view(torch.float32)
    g = torch.Generator().manual_seed(7)
    rnd = (torch.randint(-2 ** 31, 2 ** 31 - 1, (12000,), generator=g, dtype=torch.int64).to(torch.int32)
           .view(torch.float32))                                     # includes NaN and inf bit patterns
    vals = torch.cat([near, -near, rnd, torch.tensor([0.0, -0.0, float("nan"), -float("nan")])])
    x = torch.zeros(128, -(-vals.numel() // (128 * 128)) * 128)
    x.view(-1)[:vals.numel()] = vals
    x[0, ::128] = float("inf")
    return x


@pytest.mark.parametrize("fp8_dtype,fp8_max", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)],
                         ids=["e4m3", "e5m2"])
def test_integer_fp8_encoder_matches_torch_cast(fp8_dtype, fp8_max):
    x = _encoder_probe(fp8_max)
    s = quantize_blockwise(x, fp8_dtype=fp8_dtype)[1]
    assert bool((s == 1.0).all())                                    # the probe's premise: scale 1
    assert _check(x, (128, 128), fp8_dtype=fp8_dtype, **FAST) == (0, 0)


def _edge_tensors():
    f32 = torch.finfo(torch.float32)
    out = {"all_zero": torch.zeros(130, 130), "negative_zero": torch.full((130, 130), -0.0)}
    n = torch.randn(256, 140)
    n[:128, :128] = float("nan")                                     # a block of NaN only: amax 0, scale 1
    n[200, 7] = -float("nan")
    out["nan_block"] = n
    i = torch.randn(140, 260)
    i[3, 4], i[130, 200], i[139, 259] = float("inf"), -float("inf"), float("inf")
    out["inf"] = i
    out["fp32_subnormal"] = torch.randn(130, 130) * f32.tiny / 2 ** 10      # amax subnormal: scale -> FLT_MAX
    out["scale_overflow"] = torch.randn(130, 140) * 1e-37
    sign = torch.tensor([1.0, -1.0]).repeat(129 * 131)[:129 * 131].view(129, 131)
    out["exact_448"] = torch.full((129, 131), 448.0) * sign
    out["huge"] = torch.randn(130, 130) * 3e38
    out["one_element"] = torch.tensor([[3.0]])
    out["one_row"] = torch.randn(1, 300)
    out["one_col"] = torch.randn(300, 1)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_fixed_edge_cases(dtype):
    """Each edge tensor in two of the eight modes (rotating), then the input dtype's own subnormals in four."""
    bad = []
    for j, (name, x) in enumerate(_edge_tensors().items()):
        if dtype != torch.float32:
            m = torch.finfo(dtype).max
            x = torch.where(torch.isfinite(x), x.clamp(-m, m), x)
        x = x.to(dtype)
        for pow2, eps, block in (MODES[j % 8], MODES[(j + 3) % 8]):
            d = _check(x, block, pow2, eps, **FAST)
            if d != (0, 0):
                bad.append((name, pow2, eps, block, d))
    sub = {torch.bfloat16: 2.0 ** -130, torch.float16: 2.0 ** -20, torch.float32: 2.0 ** -140}[dtype]
    x = (torch.randn(130, 140) * sub).to(dtype)                      # subnormals of the input dtype itself
    assert bool((x != 0).any()) and bool((x.float().abs() < torch.finfo(dtype).tiny).all())
    for pow2, eps, block in MODES[::2]:
        if _check(x, block, pow2, eps, **FAST) != (0, 0):
            bad.append(("input_subnormal", pow2, eps, block))
    assert not bad, bad


def test_layouts_expert_stack_noncontiguous_and_other_blocks():
    g = torch.Generator().manual_seed(3)
    e = (torch.randn(3, 130, 200, generator=g) * 10).bfloat16()
    assert _check(e, (128, 128), **FAST) == (0, 0)
    assert _check(e, (1, 128), pow2=True, **FAST) == (0, 0)
    w = torch.randn(140, 260, generator=g)
    assert _check(w, (128, 128), view=lambda t: t.t(), **FAST) == (0, 0)          # transposed: strided loads
    assert _check(w, (1, 128), view=lambda t: t[1:, 3:], **FAST) == (0, 0)        # misaligned storage offset
    stack = torch.randn(3, 2, 40, 130, generator=g)
    for block in ((128, 128), (1, 128)):                                          # leading dims not one view
        assert _check(stack, block, view=lambda t: t.transpose(0, 1), **FAST) == (0, 0)
    assert _check(w, (32, 64), eps=1e-2, **FAST) == (0, 0)           # other power-of-two blocks
    assert _check(w[:40], (1, 100)) == (0, 0) and _check(w, (100, 60), **FAST) == (0, 0)   # non-power-of-two
    q, s = tb.quantize_blockwise_triton(torch.zeros(0, 128, device=DEVICE))
    assert q.shape == (0, 128) and s.shape == (0, 1)


def test_same_signature_as_the_reference():
    assert inspect.signature(tb.quantize_blockwise_triton) == inspect.signature(quantize_blockwise)


def _kernel_source(fns=None) -> str:
    """Source of the jit functions, comments and strings removed."""
    fns = fns or [v for v in vars(tb).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    src = "".join(inspect.getsource(f.fn) for f in fns)
    toks = [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
            if t.type not in (tokenize.COMMENT, tokenize.STRING)]
    return " ".join(toks)


def test_kernel_uses_div_rn_not_slash():
    """A bare `/` is exact in the interpreter but `div.full.f32` (~2 ulp) on the GPU: forbid it in the kernel
    (every jit function of the module: the quantizer and the helpers C1's requantize kernel shares)."""
    src = _kernel_source()
    assert "_scale" in src and "_blockwise_kernel" in src and "_tile_codes" in src
    assert src.count("div_rn") == 2                      # scale = 448 / amax and scale_inv = 1 / scale, in _scale
    assert not re.search(r"(?<![/])/(?![/=])", src), "float division `/` in the kernel: use tl.math.div_rn"


# The builds the CPU suite compiles for sm90 (no GPU needed) and reads: the quantizer's default build (persistent,
# cp.async pipeline), a one-program-per-block fp16 build, a persistent 1x128 fp32 build, the two-pass sliced
# build, and C1's requantize kernel; each with the hardware conversion and with the integer encoder.
PTX_SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fp8check.harness.formats import triton_blockwise as tb, triton_requantize as rq
FMT = dict(FP8_MAX=448.0, INPUT_MAX=3.3895313892515355e38, MANT=3, BIAS=7, MAX_BITS=0x43E00000, MAX_CODE=0x7E,
           NAN_CODE=0x7F)
BUILDS = {"persist-bf16-128x128": dict(kind=0, bn=128, rows=128, sub=128, even=True, stages=3, warps=8),
          "tile-fp16-128x128": dict(kind=1, bn=128, rows=128, sub=128, even=False, stages=0, warps=16),
          "persist-fp32-1x128": dict(kind=2, bn=1, rows=32, sub=32, even=True, stages=3, warps=4),
          "sliced-bf16-128x128": dict(kind=0, bn=128, rows=128, sub=32, even=False, stages=0, warps=8)}
out = {}
for hw in (False, True):
    for name, b in BUILDS.items():
        sig = {"x_ptr": "*i32" if b["kind"] == 2 else "*i16", "q_ptr": "*u8", "s_ptr": "*fp32", "N": "i32",
               "K": "i32", "sxb": "i32", "sxn": "i32", "sxk": "constexpr", "gn": "i32", "gk": "i32",
               "row_tiles": "i32", "items": "i32", "eps": "fp32", "pow2": "i32"}
        const = dict(IN_KIND=b["kind"], BN=b["bn"], BK=128, ROWS=b["rows"], SUB=b["sub"], BK_P2=128, EVEN=b["even"],
                     STAGES=b["stages"], HW_CAST=hw, **FMT)
        sig.update({k: "constexpr" for k in const})
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}   # what Triton specializes for aligned tensors
        k = triton.compile(ASTSource(fn=tb._blockwise_kernel, signature=sig, constexprs={**const, "sxk": 1},
                                     attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": b["warps"]})
        out[f"{'hw' if hw else 'int'}-{name}"] = k.asm["ptx"]
    sig = {"table_ptr": "*i64", "piece_ptr": "*i32", "flag_ptr": "*u8", "x_base": "*i16", "q_base": "*u8",
           "s_base": "*i32", "eps": "fp32", "pow2": "i32", "pid0": "i32"}
    const = dict(ROW=rq.ROW, IN_KIND=0, VEC=8, LAYOUT=2, EVEN=True, BN=128, BK=128, ROWS=128, SUB=128, BK_P2=128,
                 HW_CAST=hw, **FMT)
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
    k = triton.compile(ASTSource(fn=rq._requantize_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    out[f"{'hw' if hw else 'int'}-requantize-bf16-128x128"] = k.asm["ptx"]
print(json.dumps(out))
"""


def test_sm90_ptx_keeps_ieee_operations():
    """Compile the kernels for sm90 here (no GPU needed) and read their PTX: `div.rn.f32` for both divisions and
    no approximate division / reciprocal, fp32 `mul` without ftz, no FMA; 16-byte input reads (`ld.global.v4`, or
    16-byte `cp.async` copies where the pipeline stages tiles in shared memory) and 16-byte code stores (the
    requantize kernel stores only its flag); the GPU build's fp8 conversion is the hardware's round-to-nearest,
    saturating one and nothing else (NaN selected apart), the integer build (the one the interpreter runs) has
    none; the default build's pipeline is there (its copies, commits and waits)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        if "ptxas" in r.stderr or "NVPTX" in r.stderr or "not supported" in r.stderr:
            pytest.skip(f"triton cannot compile for sm90 here: {r.stderr.strip().splitlines()[-1]}")
        raise AssertionError(r.stderr[-3000:])
    builds = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(builds) == 10
    for name, ptx in builds.items():
        found = re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z]+(?:\.[a-z0-9]+)*)", ptx, flags=re.M)
        ops = {op: found.count(op) for op in set(found)}
        flat = " ".join(ops)
        assert ops.get("div.rn.f32", 0) >= 2, (name, ops)
        assert ops.get("mul.f32", 0) > 0 and "ftz" not in flat, (name, ops)
        assert not re.search(r"div\.(full|approx)|rcp|fma", flat), (name, ops)
        vec_loads = ops.get("ld.global.v4.b32", 0) + len(
            re.findall(r"cp\.async\.cg\.shared\.global \[[^\]]*\], \[[^\]]*\], 0x10", ptx))
        assert vec_loads > 0, (name, ops)
        if "requantize" not in name:
            assert ops.get("st.global.v4.b32", 0) > 0, (name, ops)
        if "persist" in name:                            # cp.async.commit_group / wait_group, as the regex cuts them
            assert ops.get("cp.async.commit", 0) > 0 and ops.get("cp.async.wait", 0) > 0, (name, ops)
        fp8_ops = {op for op in ops if re.search(r"e4m3|e5m2", op)}
        if name.startswith("hw"):
            assert fp8_ops == {"cvt.rn.satfinite.e4m3x2.f32"} and ops.get("setp.nan.f32", 0) > 0, (name, ops)
        else:
            assert not fp8_ops and "satfinite" not in flat, (name, ops)
