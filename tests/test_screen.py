"""The checks' one-round-trip screens (harness.bitview.differs / flag / any_of / resolve), the forward's one-batch
window and the in-place dequantization: each gives what the one-at-a-time code gave."""
import torch

from fp8check.harness.bitview import ScreenMode, any_of, bits_equal, differs, flag, resolve
from fp8check.harness.formats.blockwise import dequantize_blockwise
from fp8check.harness.numerics.forward import LayerWindow


def _pairs():
    a = torch.randn(300, 257)
    b = a.clone()
    b[7, 9] = float("nan")
    neg0 = a.clone()
    neg0[0, 0] = -0.0 if a[0, 0] == 0 else -a[0, 0]
    return [(a, a.clone()), (a, b), (a, a[:10]), (a, a.double()), (a, neg0), (a, a),
            (a.to(torch.float8_e4m3fn), a.to(torch.float8_e4m3fn).clone()),
            (torch.zeros(0), torch.zeros(0)), (a[:, 1:], a.clone()[:, 1:])]


def test_deferred_flags_resolve_to_bits_equal():
    pairs = _pairs()
    want = [not bits_equal(x, y) for x, y in pairs]
    assert want == [False, True, True, True, True, False, False, False, False]
    deferred = [differs(x, y, ScreenMode.DEFERRED) for x, y in pairs]
    assert any(isinstance(f, torch.Tensor) for f in deferred)      # the device path really ran
    assert resolve(deferred) == want
    assert resolve([differs(x, y) for x, y in pairs]) == want      # eager on the CPU


def test_differs_chunks_a_long_tensor(monkeypatch):
    import fp8check.harness.bitview as bv
    monkeypatch.setattr(bv, "CHUNK", 64)
    a = torch.arange(1000, dtype=torch.int64)
    b = a.clone()
    b[999] = 0
    assert resolve([differs(a, b, ScreenMode.DEFERRED), differs(a, a.clone(), ScreenMode.DEFERRED)]) == [True, False]


def test_any_of_and_flag():
    t, f = torch.tensor(True), torch.tensor(False)
    assert any_of(False, True) is True and any_of(False, False) is False
    assert resolve([any_of(False, f), any_of(f, t), any_of(t)]) == [False, True, True]
    assert flag(torch.tensor(True)) is True          # on the CPU a flag is a bool at once
    deferred = flag(torch.tensor(True), ScreenMode.DEFERRED)
    assert isinstance(deferred, torch.Tensor) and resolve([deferred]) == [True]
    assert resolve([]) == []


def test_one_batch_window_keeps_one_value_and_releases():
    made = []

    class Lazy(dict):
        def __getitem__(self, k):
            made.append(k)
            return torch.zeros(1)
    names = ["model.layers.0.a", "model.layers.0.b", "model.layers.1.a", "model.norm.weight"]
    w = LayerWindow(Lazy({n: None for n in names}), whole_layer=False)
    for n in names[:2] + names[:2]:
        w[n]
    assert made == names[:2] * 2                      # one value held at a time: a re-read makes it again
    whole = LayerWindow(Lazy({n: None for n in names}))
    made.clear()
    for n in names[:2] + names[:2] + [names[3], names[2], names[3]]:
        whole[n]
    assert made == names[:2] + [names[3], names[2]]   # a layer's values kept, the norm kept across layers
    whole.release()
    assert list(whole._held) == [names[3]]


def test_dequantize_in_place_leaves_its_input_alone():
    codes = torch.randn(256, 256).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 2) + 0.5
    y = dequantize_blockwise(codes, scale)
    ref = codes.float().view(2, 128, 2, 128) * scale[:, None, :, None]
    assert torch.equal(y, ref.view(256, 256))
    f32 = codes.float()                              # an fp32 "code" tensor: to_float returns it as is
    keep = f32.clone()
    dequantize_blockwise(f32, scale)
    assert torch.equal(f32, keep)
    odd = codes[:200, :130]                          # partial blocks: the expanded-scale path
    assert torch.equal(dequantize_blockwise(odd, scale), odd.float() * scale.repeat_interleave(128, 0)
                       .repeat_interleave(128, 1)[:200, :130])


def test_rollout_in_checkpoint_coordinates_holds_no_copy_at_tp1():
    """At TP 1 every checkpoint tensor the engine holds whole (o_proj and down_proj too, whose row-parallel pieces
    name their columns) is a view of the engine's parameter: the checks keep `rollout_hf` for the whole catalog.
    After a digest-first capture that proved every parameter it is the trainer's own tensor: nothing built."""
    from fp8check.harness.config import recommended_config
    from fp8check.harness.sync.capture import DigestFirst, FullRead
    from fp8check.harness.sync.pipeline import reference_sync
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    res, *_ = reference_sync(cfg, capture=FullRead(), checks=False)
    held = {t.untyped_storage().data_ptr() for t in res.rollout.tensors.values()}
    rhf = res.context().rollout_hf
    assert any(".o_proj." in n for n in rhf) and any(".down_proj." in n for n in rhf)
    assert [n for n, t in rhf.items() if t.untyped_storage().data_ptr() not in held] == []
    res, *_ = reference_sync(cfg, capture=DigestFirst(), checks=False)
    ctx = res.context()
    assert set(res.rollout.proof.matched) == set(res.rollout.names())
    assert ctx.proven_hf == set(ctx.rollout_hf) and len(ctx.rollout_hf) == len(rhf)
    assert [n for n, t in ctx.rollout_hf.items() if t is not res.trainer[n]] == []


# faults S2 / S3 / S4 / C1 catch (codes, scales, layout, recipe) and a clean run: their findings through the GPU's
# deferred flags (`ScreenMode.DEFERRED` on the CPU) are the eager path's, message and evidence included
DEFERRED_CELLS = [(None, "tiny-dense", "blockwise-fp32"), (None, "tiny-moe", "blockwise-pow2")] + [
    (f, m, r) for f in ("scale_nan_block", "scale_dropped", "megatron_qkv_not_deinterleaved", "e5m2_codes",
                        "zero_sign_canonicalized", "scale_bit_flip", "trainer_epsilon_mismatch", "trainer_pow2_scales",
                        "scale_grid_transposed", "fp32_scales_rounded_pow2", "experts_permuted",
                        "bytes_corrupted_unverified")
    for m, r in (("tiny-dense", "blockwise-fp32"), ("tiny-moe", "blockwise-pow2"))]
SCREENED = ("S2", "S3", "S4", "C1")          # the checks that take a `screen`


def test_deferred_flags_give_the_eager_findings(monkeypatch):
    """Each screened check run with `screen=ScreenMode.DEFERRED` (every flag a tensor until `resolve`, as on a GPU)
    gives the findings it gives by default on the CPU (every flag a bool at once); the deferred run really resolved
    tensor flags and the default one none."""
    import dataclasses
    from functools import partial
    from fp8check import faults
    import fp8check.harness.bitview as bv
    from fp8check.harness.config import recommended_config
    from fp8check.harness.sync.pipeline import NoTarget, fault_config, reference_sync
    from fp8check.invariants import REGISTRY, run_invariant
    real_resolve, resolved = bv.resolve, []

    def counting(flags):
        resolved.extend(not isinstance(f, bool) for f in flags)
        return real_resolve(flags)
    monkeypatch.setattr(bv, "resolve", counting)

    def findings(ctx, screen):
        out = []
        for i in SCREENED:
            inv = REGISTRY[i]
            check = inv.check if screen is None else partial(inv.check, screen=screen)
            out += run_invariant(dataclasses.replace(inv, check=check), ctx)
        return [(x.invariant_id, x.verdict, x.tensor, x.message, repr(x.evidence)) for x in out]
    ran = 0
    for fault, model, recipe in DEFERRED_CELLS:
        f = faults.FAULTS[fault] if fault else None
        base = recommended_config(model, recipe)
        if f is not None and not f.applies(base):
            continue
        try:
            res, _, _ = reference_sync(fault_config(base, f), fault=f, checks=False)
        except NoTarget:
            continue
        resolved.clear()
        eager = findings(res.context(), None)
        assert not any(resolved), (fault, model, recipe)          # by default the CPU's flags are bools at once
        deferred = findings(res.context(), bv.ScreenMode.DEFERRED)
        assert any(resolved), (fault, model, recipe)              # the device path really ran
        assert deferred == eager, (fault, model, recipe)
        assert f is None or any(v == "fail" for _, v, *_ in eager), (fault, model, recipe)
        ran += 1
    assert ran >= 16


def test_a_non_finite_pow2_scale_is_one_finding_not_two():
    """S3 judges power-of-two encoding only where every scale is finite and positive (as the eager check's
    `continue` did): a NaN block scale is "non-positive or non-finite", never also "log2 not integral"."""
    from fp8check import faults
    from fp8check.faults.matrix import run_cell
    cell = run_cell(faults.FAULTS["scale_nan_block"], "tiny-dense", "blockwise-pow2")
    s3 = [f.message for f in cell.findings if f.invariant_id == "S3"]
    assert any("non-positive or non-finite" in m for m in s3), s3
    assert not any("log2 not integral" in m for m in s3), s3


def test_segment_flags_per_tensor_and_the_second_only_where_the_first_is_clear():
    """S3's encoding screens over one concatenation: each tensor's flags are its own (a NaN in one scale grid says
    nothing of its neighbours), mixed dtypes are read as values, and 'not a power of two' is judged only where every
    scale is finite and positive."""
    import torch
    from fp8check.harness.bitview import ScreenMode, resolve
    from fp8check.harness.formats import is_pow2
    from fp8check.invariants.screens import segment_flags
    ts = [torch.tensor([0.5, 2.0]), torch.tensor([0.5, float("nan"), 3.0]), torch.tensor([3.0]),
          torch.tensor([1.0, 1.5]).bfloat16(), torch.zeros(0), torch.tensor([[0.25, -1.0]])]

    def masks(flat):
        v = flat.float()
        return [~(torch.isfinite(v) & (v > 0)), ~is_pow2(v)]
    for mode in ScreenMode:
        bad, not_pow2 = (resolve(f) for f in segment_flags(ts, masks, mode))
        assert bad == [False, True, False, False, False, True]
        assert not_pow2 == [False, False, True, True, False, False]


def test_vector_element_flags_resolve_with_the_others():
    """`FlagOf` (a screen's per-tensor flag: element i of one vector) resolves beside bools and 0-d tensors, one
    host copy per vector; `flag` keeps it deferred where flags are deferred; `any_of` takes it."""
    import torch
    import fp8check.harness.bitview as bv
    a, b = torch.tensor([True, False, True]), torch.tensor([False, True])
    flags = [False, bv.FlagOf(a, 2), torch.tensor(False), bv.FlagOf(b, 0), True, bv.FlagOf(a, 1), bv.FlagOf(b, 1)]
    assert bv.resolve(flags) == [False, True, False, False, True, False, True]
    assert bv.flag(bv.FlagOf(a, 0)) is True and bv.flag(bv.FlagOf(b, 0)) is False
    deferred = bv.flag(bv.FlagOf(a, 1), bv.ScreenMode.DEFERRED)
    assert isinstance(deferred, bv.FlagOf) and bv.resolve([deferred]) == [False]
    assert bv.resolve([bv.any_of(bv.FlagOf(a, 1), torch.tensor(False))]) == [False]
    assert bv.resolve([bv.any_of(bv.FlagOf(a, 1), bv.FlagOf(b, 1))]) == [True]
