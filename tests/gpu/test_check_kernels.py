"""On the GPU host: the kernels the capture and the per-sync checks run, compiled for the H200, against the CPU
reference they mirror (the CPU suite runs the same code in Triton's interpreter, whose arithmetic is not the
GPU's): the state digest over pieces at word offsets with its sentinel screen, the expected state's digests from
a real layout (fused q|k|v, gate|up, experts) against the built tensors', and S3's zero-block screen."""
import pytest
import torch

from fp8check.harness.digest import Assembled, assembled_digests, state_digests
from fp8check.harness.formats.bytes import any_sentinel

pytestmark = pytest.mark.gpu


def _mixed():
    g = torch.Generator().manual_seed(7)
    u8 = torch.randint(0, 256, (3 * 4096 * 4 + 77,), dtype=torch.uint8, generator=g)
    f = torch.randn(3 * 4096 + 9, generator=g)
    poison = f.clone()
    poison[5000] = torch.tensor(-1, dtype=torch.int32).view(torch.float32)
    return {"aligned": f, "bf16_odd": f[1:].bfloat16(), "u8_unaligned": u8[3:], "u8_words": u8[4:4 * 4096 + 8],
            "fp8": f.to(torch.float8_e4m3fn), "strided": f[: 4096 * 2].reshape(64, -1).t(), "poisoned": poison,
            "empty": torch.zeros(0), "scalar": torch.tensor(2.5)}


@pytest.mark.parametrize("g", [None, 3, 4])
def test_cuda_digests_equal_the_cpu_ones(g, monkeypatch):
    """The default blocks a program sums, and others: the definition's sums whatever the launch shape."""
    from fp8check.harness import digest_triton as dt
    if g is not None:
        monkeypatch.setattr(dt, "BLOCKS_PER_PROGRAM", g)
    ts = _mixed()
    want = state_digests(ts)
    got = state_digests({n: t.cuda() for n, t in ts.items()})
    assert got == want


def test_a_kept_plan_digests_the_bytes_there_now(monkeypatch):
    """On CUDA plans are kept by address: new bytes at a kept address give the new digest, from the kept plan."""
    from fp8check.harness import digest_triton as dt
    monkeypatch.setattr(dt, "_PLANS", {})
    ts = {n: t.cuda() for n, t in _mixed().items() if t.is_contiguous()}
    first = state_digests(ts)
    assert len(dt._PLANS) == 1
    ts["aligned"].view(torch.uint8)[123] ^= 0x10
    second = state_digests(ts)
    assert len(dt._PLANS) == 1 and second["aligned"] != first["aligned"]
    assert second == state_digests({n: t.cpu() for n, t in ts.items()})


def test_pieces_at_word_offsets_and_sentinels_on_the_gpu():
    ts = _mixed()
    f = ts["aligned"]
    targets = {
        "fused": Assembled((3 * 4096 + 9 + 4096 * 2,), torch.float32, torch.device("cuda"),
                           ((f.cuda(), 0), (ts["poisoned"][: 4096 * 2].cuda(), (3 * 4096 + 9) * 4))),
        "gap": Assembled((5 * 4096,), torch.float32, torch.device("cuda"), ((f[:100].cuda(), 4 * 4096 * 4 + 16),)),
        "poisoned": Assembled(tuple(ts["poisoned"].shape), torch.float32, torch.device("cuda"),
                              ((ts["poisoned"].cuda(), 0),)),
    }
    got = assembled_digests(targets, sentinels=True)
    for n, a in targets.items():
        built = a.materialize().cpu()
        assert got[n] == (state_digests({"t": built})["t"], any_sentinel(built)), n
    assert got["poisoned"][1] and not got["gap"][1]


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_expected_state_digests_equal_the_built_states(model):
    """The capture's expected digests from the trainer's tensors where they lie, on the GPU, equal the digests of
    the expected state built on the CPU (the CPU suite's oracle path)."""
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.numerics.expected import ExpectedState, expected_engine_state
    cfg = recommended_config(model, "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    hf = trainer.export_hf()
    want = {n: (d, any_sentinel(t)) for (n, t), d in
            zip(expected_engine_state(cfg, hf, None).items(),
                state_digests(expected_engine_state(cfg, hf, None)).values())}
    on_gpu = ExpectedState(cfg, {n: t.cuda() for n, t in hf.items()}, None)
    assert on_gpu.digests(list(on_gpu), sentinels=True) == want


def test_zero_block_screen_on_the_gpu():
    from fp8check.harness.formats.zero_blocks import _kernel_flags, wrong_zero_blocks
    g = torch.Generator().manual_seed(1)
    pairs = []
    for n, k, zero, one in [(256, 384, (1, 2), False), (256, 384, (1, 2), True), (200, 136, (1, 1), False),
                            (512, 4096, None, False), (130, 260, (1, 0), False), (256, 256, (1, 1, 127), False),
                            (256, 128 * 11, (1, 9), False), (384, 128 * 10, (2, 8, 127), False)]:
        q = (torch.randn(n, k, generator=g) * 50).to(torch.float8_e4m3fn)
        q.view(torch.uint8)[q.view(torch.uint8) & 0x7F == 0] = 1
        s = torch.rand(-(-n // 128), -(-k // 128), generator=g) + 0.5
        if zero:             # (block row, block column[, rows]): the block's first rows (all of them by default)
            rows = zero[2] if len(zero) > 2 else 128
            q.view(torch.uint8)[zero[0] * 128:zero[0] * 128 + rows, zero[1] * 128:(zero[1] + 1) * 128] = 0x80
            if one:
                s[zero[:2]] = 1.0
        pairs.append((q, s))
    want = [bool(wrong_zero_blocks(q, s, (128, 128)).any()) for q, s in pairs]
    # zero but for its last row (the screen reads on past the first row, and finds it); the last two in a
    # program's second run of blocks (harness.formats.zero_blocks.BLOCKS_PER_PROGRAM)
    assert want == [True, False, True, False, True, False, True, False]
    assert _kernel_flags([(q.cuda(), s.cuda()) for q, s in pairs], (128, 128)).tolist() == want


def test_kernels_warm_at_start():
    from fp8check.harness.formats.recipe import get_recipe
    from fp8check.harness.numerics.warmup import warm_kernels
    assert warm_kernels("cuda", get_recipe("blockwise-fp32")) == ["digest", "zero_blocks", "quantizer", "requantize"]
    assert warm_kernels("cpu") == []
