"""NeMo RL's FP8 generation (NVIDIA-NeMo/RL 7ea279ab) under fp8check's pytest plugin, with NeMo RL's own quantizer
(`cast_tensor_to_fp8_blockwise`, executed from its source) on the engine's load path: what fp8check finds, model by
model. Run: `pytest examples/nemo_rl_fp8_generation` (NeMo RL's fp8.py fetched once:
`python examples/nemo_rl_fp8_generation/nemo_rl_loader.py --fetch`).

The configurations are fp8check's reading of a NeMo RL FP8 generation job (`fp8check preflight` resolves one to
`rollout.quantization=nemo-rl-blockwise`): the engine is judged against NeMo RL's rule over the learner's BF16
masters, as fp8check re-states it (harness.numerics.nemo_rl). Every expectation follows from NeMo RL's mechanism,
stated beside it; the table in README.md is what these tests assert."""
import sys

import pytest

import nemo_rl_loader

WHY = nemo_rl_loader.why_not()
if WHY:
    pytest.skip(WHY, allow_module_level=True)

import torch  # noqa: E402

from fp8check.harness.config import RolloutConfig  # noqa: E402
from fp8check.harness.integrations.check import SyncCheckFailed  # noqa: E402
from fp8check.harness.numerics.nemo_rl import cast_to_fp8_blockwise  # noqa: E402
from fp8check.harness.numerics.online import per_block_cast_to_fp8  # noqa: E402
from nemo_rl_sync import nemo_cast, nemo_ignored_layers, nemo_rl_refit  # noqa: E402

FP32, POW2 = "blockwise-fp32", "blockwise-pow2"
NEMO = RolloutConfig(quantization="nemo-rl-blockwise")
VLLM_PER_BLOCK = RolloutConfig(quantization="online-per-block")
# tiny-dense, the plugin's learner after one optimizer step: NeMo RL's rule against vLLM's per_block_cast_to_fp8,
# counted by a byte comparison (README's table)
TINY_DENSE_CODES_DIFFER, TINY_DENSE_SCALES_DIFFER, TINY_DENSE_BLOCKS = 3106, 223, 320


def on(model, recipe, rollout=NEMO, **marks):
    m = [pytest.mark.fp8check(model=model, recipe=recipe, rollout=rollout)]
    if marks:
        m.append(pytest.mark.nemo_rl(**marks))
    return pytest.param(model, recipe, marks=m, id=f"{model}-{recipe}")


def failing(e):
    return {f.invariant_id for f in e.value.findings if f.verdict == "fail"}


def first(e):
    f = next(f for f in e.value.findings if f.verdict == "fail")
    return f.invariant_id, f.tensor


def named(e, inv):
    return {f.tensor for f in e.value.findings if f.verdict == "fail" and f.invariant_id == inv and f.tensor}


# -- NeMo RL's own function, and fp8check's re-statement of it -------------------------------------------------------

def test_nemo_rl_runs_from_its_source_at_the_pinned_commit():
    m = nemo_rl_loader.load()
    assert m.FP8_BLOCK_QUANT_KWARGS["weight_block_size"] == [128, 128]
    assert m.cast_tensor_to_fp8_blockwise.__code__.co_filename.endswith(nemo_rl_loader.PATH)
    assert not any(k == "nemo_rl" or k.startswith("nemo_rl.") for k in sys.modules)   # NeMo RL never imported


SHAPES = [(512, 512), (1024, 512), (300, 200), (130, 130), (4, 512), (1, 7), (129, 384)]


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_fp8checks_rule_is_nemo_rls_own_byte_for_byte(shape, pow2):
    """Random BF16 weights (what a refit carries), with an all-zero block, a block holding inf and one of tiny
    values: codes and scale_inv bits equal, padding (the last element) included."""
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    for case in ("random", "zero-block", "inf", "tiny"):
        w = (torch.randn(*shape, generator=g) * 0.02).bfloat16()
        if case == "zero-block":
            w[:128, :128] = 0
        elif case == "inf":
            w[0, 0] = float("inf")
        elif case == "tiny":
            w = (w.float() * 1e-30).bfloat16()
        q, s = nemo_cast(pow2)(w.to(torch.float), weight_block_size=[128, 128])
        q2, s2 = cast_to_fp8_blockwise(w, pow2=pow2)
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)), case
        assert torch.equal(torch.squeeze(s, -1).view(torch.int32), s2.view(torch.int32)), case


@pytest.mark.parametrize("model,recipe", [on("tiny-dense", FP32)])
def test_nemo_rls_rule_is_not_vllms_per_block_cast(fp8check_trainer, fp8check_config, model, recipe):
    """What fp8check read NeMo RL's FP8 generation as before (vLLM's `fp8_per_block`: per_block_cast_to_fp8) is
    another rule: NeMo RL's scale is 448 * fl(1/amax), vLLM's scale_inv amax * fl(1/448). On tiny-dense every weight
    is whole blocks (no padding), and still the scales differ in about two blocks of three and a few thousand codes
    by one E4M3 step. Counted byte by byte with NeMo RL's own function, and the same with fp8check's re-statement."""
    masters = {n: t.bfloat16() for n, t in fp8check_trainer.master_hf().items()}
    counts = []
    for cast in (lambda w: nemo_cast(False)(w.to(torch.float), weight_block_size=[128, 128]),
                 lambda w: cast_to_fp8_blockwise(w)):
        codes = scales = blocks = 0
        for n in fp8check_config.fp8_tensor_names:
            q, s = cast(masters[n])
            qv, sv = per_block_cast_to_fp8(masters[n].float())
            a, b = q.view(torch.uint8).int(), qv.view(torch.uint8).int()
            codes += int((a != b).sum())
            scales += int((s.reshape(sv.shape).view(torch.int32) != sv.view(torch.int32)).sum())
            blocks += sv.numel()
            assert int((a - b).abs().max()) <= 1
        counts.append((codes, scales, blocks))
    assert counts[0] == counts[1] == (TINY_DENSE_CODES_DIFFER, TINY_DENSE_SCALES_DIFFER, TINY_DENSE_BLOCKS)


# -- the refit as NeMo RL runs it --------------------------------------------------------------------------------

@pytest.mark.parametrize("model,recipe", [on("tiny-dense", FP32), on("tiny-dense", POW2), on("tiny-rl", FP32),
                                          on("tiny-rl", POW2), on("tiny-hybrid", FP32)])
def test_the_refit_is_what_fp8check_says_nemo_rl_does(fp8check_sync, model, recipe):
    """NeMo RL's BF16 refit through its load path, with its own quantizer: every weight the engine holds is
    fp8check's nemo-rl-blockwise rule over the learner's BF16 masters, byte for byte (FP32 scales, and power-of-two
    scales with vLLM's UE8M0 requantization after it), the update completes and a second one changes nothing."""
    fp8check_sync(nemo_rl_refit)


ROUTER_KWS = ["mlp.gate"]


def _moe_modules():
    from fp8check.harness.config import recommended_config
    from fp8check.harness.models import LINEAR
    spec = recommended_config("tiny-moe", FP32).spec
    return sorted({t.module for t in spec.tensors() if t.kind == LINEAR}), spec.num_layers


MOE_MODULES, MOE_LAYERS = _moe_modules()


ROUTERS = {f"model.layers.{i}.mlp.gate.weight" for i in range(MOE_LAYERS)}
SHARED_GATES = {f"model.layers.{i}.mlp.shared_expert_gate" for i in range(MOE_LAYERS)}


@pytest.mark.parametrize("model,recipe", [on("tiny-moe", FP32, ignored_layers=nemo_ignored_layers(
    MOE_MODULES, ROUTER_KWS, num_layers=MOE_LAYERS))])
def test_moe_with_the_router_keyword(fp8check_sync, model, recipe):
    """quantization_ignored_layer_kws: [mlp.gate] (the example job's) keeps both routers BF16: NeMo RL's ignore list
    names `model.layers.N.mlp.gate` and nothing else. The shared-expert gates it does not name are built without a
    quant method by vLLM all the same, so NeMo RL's load path passes them through as BF16: codes, scales and values
    are right (S1-S5 hold), and only the lists differ -- S6 on the two shared-expert gates, which fp8check's
    exclusion set names and NeMo RL's ignored_layers does not, saying the engine builds them unquantized anyway."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(nemo_rl_refit)
    assert failing(e) == {"S6"}
    assert named(e, "S6") == SHARED_GATES
    assert all("unquantized all the same" in f.message for f in e.value.findings if f.verdict == "fail")


@pytest.mark.parametrize("model,recipe", [on("tiny-moe", FP32, ignored_layers=nemo_ignored_layers(
    MOE_MODULES, [], num_layers=MOE_LAYERS))])
def test_moe_without_a_router_keyword(fp8check_sync, model, recipe):
    """Without a keyword NeMo RL ignores nothing, and vLLM's Fp8Config quantizes the MoE router: NeMo RL's load path
    then quantizes each router's BF16 weight into it. The learner keeps routers BF16: the engine holds FP8 where
    BF16 is declared (S5, first, on layer 0's router), the exclusion sets disagree (S6), each router carries a
    scale_inv no trainer tensor maps to (S1) and its dequantized values are not the learner's (S4). Nothing but the
    two routers (and the shared-expert gates' list entries, S6) is named."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(nemo_rl_refit)
    assert failing(e) == {"S1", "S4", "S5", "S6"}
    assert first(e) == ("S5", "model.layers.0.mlp.gate.weight")
    assert named(e, "S5") == named(e, "S4") == ROUTERS
    assert named(e, "S1") == {r + "_scale_inv" for r in ROUTERS}
    assert named(e, "S6") == {r.removesuffix(".weight") for r in ROUTERS} | SHARED_GATES


@pytest.mark.parametrize("model,recipe", [on("tiny-dense", FP32, rollout=VLLM_PER_BLOCK)])
def test_judged_as_vllms_fp8_per_block_it_fails(fp8check_sync, model, recipe):
    """fp8check's old reading of a NeMo RL job (vLLM's fp8_per_block online method) judging NeMo RL's engine: C10
    first (the engine runs vLLM's block method from a checkpoint config, not the online method), then S2 / S3 / S4
    on every FP8 weight whose scales or codes the two rules round differently -- on tiny-dense all 14. Coverage,
    dtypes and exclusions (S1, S5, S6) hold."""
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(nemo_rl_refit)
    assert failing(e) == {"C10", "S2", "S3", "S4"}
    assert first(e)[0] == "C10"
    assert len(named(e, "S3")) == 14
