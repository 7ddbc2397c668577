"""harness.digest (state digests) against an independent pure-Python implementation of its definition (a loop
over words with Python ints), plus the properties callers rely on; the Triton kernel (harness.digest_triton)
under TRITON_INTERPRET=1 gives the same strings."""
import struct

import pytest
import torch

from fp8check.harness import digest
from fp8check.harness.digest import state_digest, state_digests

KEYS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)
M32 = 0xFFFFFFFF
B = 4096


# ---- independent oracle: the module docstring's definition, one word at a time ----
def py_fmix32(h):
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def py_multiplier(i, j):
    """m_ij = P_j[i mod B] * Q_j[i div B]: written out here from the docstring, not imported."""
    k = KEYS[j]
    p = (py_fmix32((i % B) ^ k) * 2 + 1) & M32
    blk = i // B
    q = (py_fmix32((blk & M32) ^ k ^ py_fmix32((blk >> 32) ^ k)) * 2 + 1) & M32
    return (p * q) & M32


def py_lane_sums(data: bytes, base: int = 0, whiten: bool = True):
    """whiten=False is the first draft of the definition (w_i instead of fmix32(w_i)), kept to show its blind spot."""
    data = data + b"\0" * (-len(data) % 4)
    sums = [0, 0, 0, 0]
    for n, (w,) in enumerate(struct.iter_unpack("<I", data)):
        f = py_fmix32(w) if whiten else w
        for j in range(4):
            sums[j] = (sums[j] + f * py_multiplier(base + n, j)) & M32
    return tuple(sums)


def py_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())


def py_digest(t: torch.Tensor) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    return f"fx:{dtype}:{shape}:" + "".join(f"{s:08x}" for s in py_lane_sums(py_bytes(t)))
# ---- end of the oracle ----


def _tensors():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)                      # noqa: E731
    base = torch.arange(40, dtype=torch.uint8)
    return {
        "f32": r(7, 5), "bf16": r(3, 129).bfloat16(), "f16_odd": r(3).half(), "f64": r(4).double(),
        "e4m3": r(5, 7).to(torch.float8_e4m3fn), "e5m2": r(9).to(torch.float8_e5m2),
        "u8_odd": base[:5], "i8": base[:7].to(torch.int8), "i16": base[:9].to(torch.int16), "i64": base[:3].long(),
        "bool": base[:13] % 3 == 0, "c64": torch.complex(r(3), r(3)),
        "scalar": torch.tensor(1.5), "scalar_u8": torch.tensor(7, dtype=torch.uint8),
        "empty": torch.zeros(0), "empty2d": torch.zeros(2, 0, dtype=torch.bfloat16),
        "transposed": r(33, 3).t(), "stepped": r(20, 10)[::3, 1::2], "expanded": r(3, 1).expand(3, 4),
        "misaligned_u8": base[1:38], "misaligned_bf16": r(41).bfloat16()[1:], "big": r(3000),
    }


def test_known_answer_vectors():
    known = {
        "fx:int32:10:66f3e0b8dfb215c227fe582c8a6e4752": torch.arange(10, dtype=torch.int32),
        "fx:float32:3:1edd9158a116c394151fd63cef03cb0a": torch.tensor([1.0, -2.0, 0.5]),
        "fx:bfloat16:2x3:00000000000000000000000000000000": torch.zeros(2, 3, dtype=torch.bfloat16),
        "fx:uint8:scalar:43b4406ca3ed3cdcea080acc0296df54": torch.tensor(7, dtype=torch.uint8),
    }
    for want, t in known.items():
        assert py_digest(t) == want                                  # the oracle is pinned too
        assert state_digest(t) == want


def test_matches_python_oracle_on_varied_tensors():
    for name, t in _tensors().items():
        assert state_digest(t) == py_digest(t), name


def test_equal_bits_give_equal_digests_and_different_bits_differ():
    x = torch.randn(6, 10)
    assert state_digest(x) == state_digest(x.clone()) == state_digest(x.t().contiguous().t())
    assert state_digest(x.t()) == state_digest(x.t().contiguous())   # C-order bytes, whatever the strides
    assert state_digest(torch.tensor([0.0])) != state_digest(torch.tensor([-0.0]))
    nan2 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert state_digest(torch.tensor([float("nan")])) != state_digest(nan2)
    before = x.clone()
    state_digest(x[:, 1:])                                           # the input is never modified
    assert torch.equal(x, before)


@pytest.mark.parametrize("t", [torch.randn(4, 5), torch.arange(7, dtype=torch.uint8)], ids=["f32_80B", "u8_7B"])
def test_every_single_bit_flip_changes_the_digest(t):
    raw = bytearray(py_bytes(t))
    base = state_digest(t)
    seen = {base}
    for bit in range(8 * len(raw)):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        u = torch.frombuffer(flipped, dtype=torch.uint8).clone().view(t.dtype).reshape(t.shape)
        seen.add(state_digest(u))
    assert len(seen) == 8 * len(raw) + 1                             # all distinct, none equal to the original


def test_dtype_and_shape_are_part_of_the_digest():
    x = torch.randn(4, 6)
    views = [x, x.reshape(6, 4), x.reshape(-1), x.view(torch.int32), x.view(torch.bfloat16)]
    digests = [state_digest(v) for v in views]
    assert len(set(digests)) == len(digests)
    assert len({d.rsplit(":", 1)[1] for d in digests}) == 1           # same bytes, same sums
    assert state_digest(torch.zeros(3)) != state_digest(torch.zeros(4))
    assert state_digest(torch.zeros(1)) != state_digest(torch.tensor(0.0))


def test_structured_differences_the_first_draft_could_not_see():
    """With w_i instead of fmix32(w_i), bit 31 of a word only reached bit 31 of each lane: two sign flips of
    fp32 values, an even-length fp32 tensor negated, or two fp8 sign flips in byte 3 of their words collided."""
    x = torch.randn(6)
    two_signs = x.clone()
    two_signs[[1, 4]] *= -1
    q = torch.randint(0, 127, (16,), dtype=torch.uint8)
    q2 = q.clone()
    q2[[3, 11]] ^= 0x80
    for a, b in ((x, -x), (x, two_signs), (q, q2)):
        assert py_lane_sums(py_bytes(a), whiten=False) == py_lane_sums(py_bytes(b), whiten=False)
        assert state_digest(a) != state_digest(b)


def test_chunks_and_blocks(monkeypatch):
    monkeypatch.setattr(digest, "CHUNK_WORDS", 2 * B)
    t = torch.randn(5 * B + 77)                                      # 3 chunks, the last one partial
    assert state_digest(t) == py_digest(t)
    u = torch.arange(3 * B * 4 + 3, dtype=torch.uint8)[1:]           # unaligned, with a partial last word
    assert state_digest(u) == py_digest(u)


def test_block_multipliers_with_high_index_bits():
    """Q_j for blocks past 2^32 (tensors past 16 TiB words are not real; the rule must still hold)."""
    for base in (0, B, (1 << 32) * B, ((5 << 32) + 3) * B):
        t = torch.randn(B + 9)
        assert digest.lane_sums(t, base) == py_lane_sums(py_bytes(t), base), hex(base)
    with pytest.raises(ValueError):
        digest.lane_sums(torch.randn(3), 5)


def test_state_digests_batched_and_meta():
    ts = _tensors()
    ts["meta"] = torch.empty(3, 4, device="meta", dtype=torch.bfloat16)
    out = state_digests(ts)
    assert list(out) == list(ts)
    assert out["meta"] == "meta:bfloat16:3x4"
    assert state_digest(torch.empty((), device="meta")) == "meta:float32:scalar"
    assert all(out[n] == state_digest(t) for n, t in ts.items())


def test_triton_kernel_gives_the_same_sums():
    """Under TRITON_INTERPRET=1 on CPU tensors (compiled on CUDA where present)."""
    try:
        from triton_interp import load
    except ImportError:
        from tests.triton_interp import load
    dt, device = load("fp8check.harness.digest_triton")
    ts = list(_tensors().values()) + [torch.randn(3 * dt.BLOCK + 5), torch.randn(2 * dt.BLOCK).half()]
    on = [t.to(device) for t in ts]
    u8 = torch.arange(64, dtype=torch.uint8)
    ts += [u8[1:38], u8[2:63]]                                       # misaligned on the kernel's device too
    on += [u8.to(device)[1:38], u8.to(device)[2:63]]
    assert dt.lane_sums_batched(on) == [digest.lane_sums(t) for t in ts]
    t = torch.randn(2 * dt.BLOCK + 7)
    for base in ((1 << 32) - dt.BLOCK, 3 << 32):                     # word indices crossing / past 2^32
        assert dt.lane_sums_batched([t.to(device)], base_word=base) == [py_lane_sums(py_bytes(t), base)]


def _load_kernel():
    try:
        from triton_interp import load
    except ImportError:
        from tests.triton_interp import load
    return load("fp8check.harness.digest_triton")


def _mixed_batch(n: int, block: int):
    """n tensors cycling through the dtypes and layouts the engines hold: fp8, bf16, fp32, int8, uint8; empty,
    odd byte counts, strided views, storage offsets that are not multiples of 4, a few spanning several
    programs (partial last block)."""
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (4 * block + 64,), dtype=torch.uint8, generator=g)
    f = lambda k: torch.randn(k, generator=g)                         # noqa: E731
    makers = [
        lambda i: f(3 * i + 1).to(torch.float8_e4m3fn),                # odd sizes, aligned start
        lambda i: f(2 * i + 2).bfloat16()[1:],                         # storage offset 2 bytes
        lambda i: f(i + 1),
        lambda i: raw[i % 7: i % 7 + 2 * i + 1].view(torch.int8),      # offsets 0..6, odd lengths
        lambda i: raw[:4 * i],                                         # whole words
        lambda i: f(4 * (i + 2)).reshape(4, -1).t(),                   # strided: as_bytes copies
        lambda i: torch.zeros(0, dtype=(torch.bfloat16, torch.uint8)[i % 2]),
        lambda i: f(9 * (i + 1)).to(torch.float8_e4m3fn)[3::2],        # strided fp8
        lambda i: raw[1:1 + 4 * i + 3],                                # unaligned bytes, odd length
    ]
    out = [makers[i % len(makers)](i) for i in range(n)]
    out += [f(block + 5), f(2 * block).bfloat16(), raw[3:3 + 4 * block + 2], f(block // 2 + 1).bfloat16()[1:]]
    return out


def _to(t: torch.Tensor, device: str) -> torch.Tensor:
    """t on device with the same storage offset and strides (a view of a copied storage), not a fresh copy."""
    if device == "cpu":
        return t
    base = t.untyped_storage()
    whole = torch.empty(0, dtype=t.dtype).set_(base).to(device)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def test_triton_pointer_table_many_mixed_tensors_in_one_call():
    dt, device = _load_kernel()
    ts = _mixed_batch(60, dt.BLOCK)
    on = [_to(t, device) for t in ts]
    assert any(t.storage_offset() * t.element_size() % 4 for t in on)   # the batch has unaligned tensors
    assert any(t.numel() == 0 for t in on) and any(not t.is_contiguous() for t in on)
    assert dt.lane_sums_batched(on) == [digest.lane_sums(t) for t in ts]
    small = [t for t in ts if t.numel() * t.element_size() < 400]
    on_small = [_to(t, device) for t in small]
    for base in ((1 << 32) - dt.BLOCK, 3 << 32, (1 << 32) - 37):      # the last one: blocks straddle 2^32
        assert dt.lane_sums_batched(on_small, base_word=base) == [py_lane_sums(py_bytes(t), base) for t in small]
    big = torch.randn(2 * dt.BLOCK + 7)
    base = (1 << 32) - dt.BLOCK - 1000                                 # straddling inside the tensor's 2nd block
    assert dt.lane_sums_batched([_to(big, device)], base_word=base) == [py_lane_sums(py_bytes(big), base)]


def test_triton_launches_per_batch_do_not_grow_with_the_batch(monkeypatch):
    dt, device = _load_kernel()
    launches = []

    class Counting:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launches.append(grid)
            return self.kernel[grid]

    monkeypatch.setattr(dt, "_table_kernel", Counting(dt._table_kernel))
    per_batch = {}
    for n in (1, 7, 80):
        ts = [torch.randn(16 * (i % 5 + 1)) for i in range(n)]
        launches.clear()
        assert dt.lane_sums_batched([t.to(device) for t in ts]) == [digest.lane_sums(t) for t in ts]
        per_batch[n] = len(launches)
        assert len(dt.plan([[(t, 0)] for t in ts])[0]) == per_batch[n]
    assert per_batch == {1: 1, 7: 1, 80: 1}              # aligned groups of 4 words: one (vector) launch
    ts = _mixed_batch(100, dt.BLOCK)
    launches.clear()
    assert dt.lane_sums_batched([_to(t, device) for t in ts]) == [digest.lane_sums(t) for t in ts]
    assert len(launches) == 3                            # 16-byte vectors, words, then bytes
    launches.clear()
    assert dt.lane_sums_batched([torch.zeros(0, device=device)] * 3) == [(0, 0, 0, 0)] * 3
    assert launches == []


def _fused(device: str, g):
    """Pieces as a layout map places checkpoint tensors in a fused parameter: q|k|v rows of fp8 codes, an expert
    slot, a gap left zero, a piece that starts inside a block of the definition, bf16 and fp32 scale pieces."""
    f = lambda *s: torch.randn(*s, generator=g)                        # noqa: E731
    q, k, v = (f(n, 96).to(torch.float8_e4m3fn) for n in (64, 16, 16))
    s1, s2 = f(3, 5).abs(), f(2, 5).abs()
    h1, h2 = f(7, 6).bfloat16(), f(5, 6).bfloat16()
    big = f(B + 300)                                                    # crosses a block of the definition
    spec = {
        "qkv": ((96, 96), torch.float8_e4m3fn, [(q, 0), (k, 64 * 96), (v, 80 * 96)]),
        "scale": ((5, 5), torch.float32, [(s1, 0), (s2, 60)]),
        "gap": ((14, 6), torch.bfloat16, [(h1, 0), (h2, 9 * 12)]),      # rows 7-8 stay zero
        "mid_block": ((2 * B + 400,), torch.float32, [(big, 4 * 100)]),  # first word 100: not block-aligned
        "strided": ((4, 3), torch.float32, [(f(3, 4).t(), 0)]),
    }
    on = {n: [(_to(t, device), off // 4) for t, off in pieces] for n, (_, _, pieces) in spec.items()}
    return spec, on


def test_assembled_digests_are_the_built_tensors_digests():
    from fp8check.harness.digest import Assembled, assembled_digests
    from fp8check.harness.formats.bytes import any_sentinel
    g = torch.Generator().manual_seed(3)
    spec, _ = _fused("cpu", g)
    targets = {n: Assembled(shape, dt, torch.device("cpu"), tuple(p)) for n, (shape, dt, p) in spec.items()}
    poisoned = targets["gap"].pieces[1][0].clone()
    poisoned.view(torch.int16)[2, 3] = -1                               # one bf16 element all 0xFF bytes
    targets["poisoned"] = Assembled((14, 6), torch.bfloat16, torch.device("cpu"),
                                    ((targets["gap"].pieces[0][0], 0), (poisoned, 9 * 12)))
    got = assembled_digests(targets, sentinels=True)
    for n, a in targets.items():
        built = a.materialize()
        assert got[n] == (py_digest(built), any_sentinel(built)), n
    assert got["poisoned"][1] and not got["gap"][1]
    assert assembled_digests(targets)["qkv"][1] is None
    assert targets["qkv"].word_pieces() == [(p, off // 4) for p, off in targets["qkv"].pieces]
    assert Assembled((3, 3), torch.uint8, torch.device("cpu"), ((torch.ones(3, dtype=torch.uint8), 1),)) \
        .word_pieces() is None                                           # a piece off a word boundary
    assert Assembled((3, 3), torch.uint8, torch.device("cpu"), ((torch.ones(3, dtype=torch.uint8), 0),
                                                                 (torch.ones(6, dtype=torch.uint8), 3))) \
        .word_pieces() is None                                           # two pieces would share a word


def test_triton_pieces_at_word_offsets_and_sentinels():
    """The kernel's pieces (VEC, WORD and BYTES rows, blocks of the definition entered mid-way, zero gaps) give the
    built tensor's sums, and per output whether an element of the given size is all 0xFF, in one call."""
    from fp8check.harness.digest import Assembled
    from fp8check.harness.formats.bytes import any_sentinel
    dt, device = _load_kernel()
    g = torch.Generator().manual_seed(4)
    spec, on = _fused(device, g)
    built = {n: Assembled(shape, d, torch.device("cpu"), tuple(p)).materialize() for n, (shape, d, p) in spec.items()}
    u8 = torch.arange(64, dtype=torch.uint8)
    built["unaligned"] = torch.cat([torch.zeros(8, dtype=torch.uint8), u8[3:40]])
    on["unaligned"] = [(_to(u8[3:40], device), 2)]                       # source 3 bytes into its storage
    poison = torch.randn(B + 50)
    poison[B + 10] = torch.tensor(-1, dtype=torch.int32).view(torch.float32)
    built["poison32"], on["poison32"] = poison, [(poison.to(device), 0)]
    fp8 = torch.randn(64).to(torch.float8_e4m3fn)
    fp8.view(torch.uint8)[37] = 0xFF
    built["poison8"], on["poison8"] = fp8[1:].contiguous(), [(_to(fp8, device)[1:], 0)]
    half = torch.full((6,), -1, dtype=torch.int16)
    half[::2] = 0x7FFF                                                  # 0xFFFF halves, but no all-0xFF word
    built["poison16"], on["poison16"] = half.view(torch.bfloat16), [(half.view(torch.bfloat16).to(device), 0)]
    names = list(on)
    sizes = [built[n].element_size() for n in names]
    sums, hits = dt.lane_sums_pieces([on[n] for n in names], sizes)
    assert sums == [digest.lane_sums(built[n]) for n in names]
    assert hits == [any_sentinel(built[n]) for n in names]
    assert hits[names.index("poison32")] and hits[names.index("poison8")] and hits[names.index("poison16")]
    assert not hits[names.index("qkv")]
    assert dt.lane_sums_pieces([on[n] for n in names])[1] is None


PTX_DIGEST = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fp8check.harness import digest_triton as dt
out = {}
for kind in (dt.VEC, dt.WORD, dt.BYTES):
    sig = {"table_ptr": "*i64", "piece_ptr": "*i64", "part_ptr": "*i32", "p_ptr": "*i32", "pid0": "i64",
           "ROW": "constexpr", "BLOCK": "constexpr", "KIND": "constexpr", "SENT": "constexpr", "G": "constexpr"}
    const = {"ROW": dt.ROW, "BLOCK": dt.BLOCK, "KIND": kind, "SENT": 1, "G": dt.BLOCKS_PER_PROGRAM}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    k = triton.compile(ASTSource(fn=dt._table_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    out[kind] = re.findall(r"ld\.global[.a-z0-9]*", k.asm["ptx"])
print(json.dumps(out))
"""


def test_sm90_ptx_vector_loads():
    """Compiled for sm90 here (no GPU needed): the VEC rows' data and the multiplier table load as 16-byte vectors
    (the first kernel's scalar loads from table addresses were one reason it ran at half the HBM rate)."""
    import json, os, subprocess, sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", PTX_DIGEST], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        if "ptxas" in r.stderr or "NVPTX" in r.stderr or "not supported" in r.stderr or "triton" in r.stderr and \
                "No module" in r.stderr:
            pytest.skip(f"triton cannot compile for sm90 here: {r.stderr.strip().splitlines()[-1]}")
        raise AssertionError(r.stderr[-3000:])
    loads = {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    assert "ld.global.b32" not in loads[0] and loads[0].count("ld.global.v4.b32") > 16, loads[0]   # data + table
    assert loads[1].count("ld.global.v4.b32") == 16 and "ld.global.b32" in loads[1], loads[1]   # table; scalar data


def test_a_kept_plan_reads_the_bytes_that_lie_there_now(monkeypatch):
    """Plans are kept by address, byte count and word offset (an engine's parameters lie at the same addresses
    sync after sync): a kept plan digests whatever bytes are there when it runs; a strided piece (which `as_bytes`
    would copy) is never planned for keeps; another address is another plan. `keep_plans=True` keeps them for CPU
    tensors too (the interpreter), as the GPU does by default."""
    dt, device = _load_kernel()
    monkeypatch.setattr(dt, "_PLANS", {})
    keep = dict(keep_plans=True)
    ts = [t.clone() for t in _mixed_batch(18, dt.BLOCK) if t.is_contiguous()]
    on = [_to(t, device) for t in ts]
    assert dt.lane_sums_batched(on, **keep) == [digest.lane_sums(t) for t in ts] and len(dt._PLANS) == 1
    big = max(range(len(on)), key=lambda i: on[i].numel())
    on[big].view(torch.uint8)[5] ^= 0x5A                               # new bytes at the same address
    ts[big].view(torch.uint8)[5] ^= 0x5A
    assert dt.lane_sums_batched(on, **keep) == [digest.lane_sums(t) for t in ts] and len(dt._PLANS) == 1
    elsewhere = on[big].clone()                                        # other bytes at another address
    elsewhere.view(torch.uint8)[7] ^= 0x01
    ts[big].view(torch.uint8)[7] ^= 0x01
    moved = on[:big] + [elsewhere] + on[big + 1:]
    assert dt.lane_sums_batched(moved, **keep) == [digest.lane_sums(t) for t in ts] and len(dt._PLANS) == 2
    strided = _to(torch.randn(8, 64).t(), device)
    assert dt.lane_sums_batched([strided], **keep) == [digest.lane_sums(strided)] and len(dt._PLANS) == 2
    assert dt.lane_sums_batched(on[:1], keep_plans=False) == [digest.lane_sums(ts[0])] and len(dt._PLANS) == 2


@pytest.mark.parametrize("g", [3, 4])
def test_any_blocks_per_program_gives_the_same_sums(g, monkeypatch):
    """A program sums BLOCKS_PER_PROGRAM blocks of a piece (one by default, the fastest measured); any count gives
    the definition's sums: pieces of one to several blocks, starting mid-block, past 2^32 words."""
    dt, device = _load_kernel()
    monkeypatch.setattr(dt, "BLOCKS_PER_PROGRAM", g)
    ts = _mixed_batch(24, dt.BLOCK) + [torch.randn(5 * dt.BLOCK + 3)]
    on = [_to(t, device) for t in ts]
    assert dt.lane_sums_batched(on) == [digest.lane_sums(t) for t in ts]
    big = torch.randn(4 * dt.BLOCK + 9)
    base = (1 << 32) - 2 * dt.BLOCK - 1000
    assert dt.lane_sums_batched([_to(big, device)], base_word=base) == [py_lane_sums(py_bytes(big), base)]
    a, b = torch.randn(3 * dt.BLOCK + 1), torch.randn(dt.BLOCK + 2)       # pieces at word offsets, sentinels
    sums, hits = dt.lane_sums_pieces([[(_to(a, device), 0), (_to(b, device), 3 * dt.BLOCK + 1)]], [4])
    assert sums == [digest.lane_sums(torch.cat([a, b]))] and hits == [False]
