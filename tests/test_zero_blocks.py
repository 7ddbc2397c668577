"""TE's all-zero-block rule screened over many tensors at once: the Triton kernel (compiled on CUDA, in the
interpreter on CPU) flags exactly the tensors the torch reference flags -- partial blocks, -0 codes, NaN scales,
unaligned widths -- and a flag belongs to its tensor alone."""
import torch

from fp8check.harness.formats.zero_blocks import wrong_zero_blocks, zero_block_flags

try:
    from triton_interp import load
except ImportError:
    from tests.triton_interp import load


def _case(n, k, zero_blocks=(), scale_one=(), nan=(), neg_zero=False, seed=0, zero_rows=()):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(n, k, generator=g) * 50).to(torch.float8_e4m3fn)
    q.view(torch.uint8)[q.view(torch.uint8) & 0x7F == 0] = 0x01        # no accidental zero block
    gn, gk = -(-n // 128), -(-k // 128)
    s = torch.rand(gn, gk, generator=g) + 0.5
    for bi, bj in zero_blocks:
        q.view(torch.uint8)[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128] = 0x80 if neg_zero else 0
    for bi, bj, rows in zero_rows:            # a block zero but for its last rows (the screen reads on past row 0)
        q.view(torch.uint8)[bi * 128:bi * 128 + rows, bj * 128:(bj + 1) * 128] = 0x80 if neg_zero else 0
    for bi, bj in scale_one:
        s[bi, bj] = 1.0
    for bi, bj in nan:
        s[bi, bj] = float("nan")
    return q, s


CASES = [
    _case(256, 256),                                          # clean
    _case(256, 384, zero_blocks=[(1, 2)]),                    # a zero block with scale != 1: wrong
    _case(256, 384, zero_blocks=[(1, 2)], scale_one=[(1, 2)]),  # ... with scale 1: right
    _case(200, 136, zero_blocks=[(1, 1)], neg_zero=True),     # partial blocks, -0 codes: wrong
    _case(130, 260, zero_blocks=[(1, 0)], nan=[(1, 0)]),      # NaN scale on a zero block: wrong
    _case(128, 132, nan=[(0, 1)]),                            # NaN scale, block not zero: right; K % 16 != 0
    _case(512, 128, zero_blocks=[(3, 0)], scale_one=[(3, 0)], seed=3),
    _case(256, 256, zero_rows=[(1, 1, 127)], seed=4),          # first 127 rows zero, the last not: right
    _case(200, 256, zero_rows=[(1, 0, 71)], neg_zero=True),   # a partial block zero but for its last row: right
    _case(256, 256, zero_rows=[(0, 1, 127)], zero_blocks=[(1, 0)], seed=5),   # beside a wrong block
    # wider than one program's run of blocks (harness.formats.zero_blocks.BLOCKS_PER_PROGRAM: 8): the second run
    _case(256, 128 * 11, zero_blocks=[(1, 9)], seed=6),                    # a wrong block in a partial second run
    _case(384, 128 * 10, zero_rows=[(2, 8, 127)], seed=7),                 # the rest read in the second run: right
    _case(256, 128 * 9 + 4, zero_blocks=[(0, 9)], seed=8),                 # the last block 4 columns wide: wrong
    _case(256, 128 * 17, zero_blocks=[(1, 16)], scale_one=[(1, 16)], seed=9),  # zero with scale 1 in a third run
]


def test_reference_rule():
    want = [bool(wrong_zero_blocks(q, s, (128, 128)).any()) for q, s in CASES]
    assert want == [False, True, False, True, True, False, False, False, False, True, True, False, True, False]
    assert [bool(f) for f in zero_block_flags(CASES, (128, 128))] == want


def test_kernel_flags_what_the_reference_flags():
    zb, device = load("fp8check.harness.formats.zero_blocks")
    pairs = [(q.to(device), s.to(device)) for q, s in CASES]
    got = zb._kernel_flags(pairs, (128, 128)).tolist()
    assert got == [bool(wrong_zero_blocks(q, s, (128, 128)).any()) for q, s in CASES]
    assert got[1] and not got[0] and not got[2]


def test_flags_as_vector_elements_resolve_to_the_reference(monkeypatch):
    """S3 asks for the kernel's flags as elements of its one vector (`flag_of=FlagOf`: no 0-d tensor per weight);
    `resolve` gives the reference's verdicts, one host copy for the vector."""
    from fp8check.harness.bitview import FlagOf, resolve
    zb, device = load("fp8check.harness.formats.zero_blocks")
    monkeypatch.setattr(zb, "_fits_kernel", lambda q, s, b: True)     # the interpreter's CPU tensors too
    pairs = [(q.to(device), s.to(device)) for q, s in CASES[:5]]
    got = zb.zero_block_flags(pairs, (128, 128), flag_of=FlagOf)
    assert all(isinstance(f, FlagOf) for f in got) and len({id(f.vector) for f in got}) == 1
    assert resolve(got) == [bool(wrong_zero_blocks(q, s, (128, 128)).any()) for q, s in CASES[:5]]
