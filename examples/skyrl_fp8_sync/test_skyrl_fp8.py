"""SkyRL 0.4.0's serialized FP8 weight sync, run from SkyRL's own functions (loaded from its wheel), under fp8check's
pytest plugin: what fp8check finds on the Qwen3.5 models (SkyRL's one registered FP8 spec), dense and MoE, on the
FP32, power-of-two and MXFP8 recipes, with and without persistent FP8 parameters. Run: `pytest
examples/skyrl_fp8_sync` (the wheel in examples/skyrl_fp8_sync/wheels or $SKYRL_WHEEL; see skyrl_loader).

Each case's row in TABLE (and in the README's table, which `test_readme_table_is_the_asserted_table` holds to it)
says which invariants fail and by how much SkyRL's bytes differ from the learner's. The sizes are counted here, by
comparing the bytes SkyRL put on the wire with the learner's FP8 forward bytes in plain torch -- not by fp8check's
findings -- and the verdicts are fp8check's. Every expectation follows from SkyRL's mechanism
(weight_sync/fp8/quantize.py, vllm_format.py, models/qwen35.py), stated beside it."""
import os
import re
from dataclasses import dataclass

import pytest
import torch

import skyrl_loader

WHY = skyrl_loader.why_not()
if WHY:
    if os.environ.get("FP8CHECK_REQUIRE_SKYRL") == "1":     # CI (.ci/run) downloads the wheel: it must run there
        raise RuntimeError(f"FP8CHECK_REQUIRE_SKYRL=1 and {WHY}")
    pytest.skip(WHY, allow_module_level=True)

import skyrl_sync  # noqa: E402
from fp8check.harness.config import TrainerConfig  # noqa: E402
from fp8check.harness.integrations.check import SyncCheckFailed  # noqa: E402
from fp8check.harness.jobconfig.skyrl_spec import skyrl_exclusion  # noqa: E402
from fp8check.harness.models import LINEAR, get_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("tiny-hybrid", "tiny-hybrid-moe")
FP32, POW2, MX = "blockwise-fp32", "blockwise-pow2", "mxfp8"
WIRE = {FP32: "blockwise", POW2: "blockwise", MX: "mxfp8"}


@dataclass(frozen=True)
class Row:
    fails: str            # the failing invariants, sorted
    codes: int            # E4M3 codes on the wire that differ from the learner's
    scales: int           # scale elements on the wire that differ from the learner's
    size: str             # by how much the differing scales differ (ulps of fp32, or a power-of-two factor)


# (model, recipe, fp8_param) -> what SkyRL's sync does there (the wire's totals per model: TOTALS)
TABLE = {
    ("tiny-hybrid", FP32, False): Row("S2 S3 S4 S6", 4575, 128, "1 ulp"),
    ("tiny-hybrid", FP32, True): Row("S3 S4 S6", 0, 320, "up to 37120 ulps"),
    ("tiny-hybrid", POW2, False): Row("S6", 0, 0, "-"),
    ("tiny-hybrid", POW2, True): Row("S2 S3 S6", 376827, 23, "x1/2"),
    ("tiny-hybrid", MX, False): Row("S6", 0, 0, "-"),
    ("tiny-hybrid", MX, True): Row("S2 S3 S6", 387391, 12106, "x1/2"),
    ("tiny-hybrid-moe", FP32, False): Row("S2 S3 S4 S6", 6760, 225, "1 ulp"),
    ("tiny-hybrid-moe", FP32, True): Row("S3 S4 S6", 0, 560, "up to 37325 ulps"),
    ("tiny-hybrid-moe", POW2, False): Row("S6", 0, 0, "-"),
    ("tiny-hybrid-moe", POW2, True): Row("S2 S3 S6", 720881, 44, "x1/2"),
    ("tiny-hybrid-moe", MX, False): Row("S6", 0, 0, "-"),
    ("tiny-hybrid-moe", MX, True): Row("S2 S3 S6", 677948, 21186, "x1/2"),
}
# FP8 codes and scale elements SkyRL sends: (model, grid) -> (codes, scales)
TOTALS = {("tiny-hybrid", "block"): (5242880, 320), ("tiny-hybrid", "mxfp8"): (5242880, 163840),
          ("tiny-hybrid-moe", "block"): (9175040, 560), ("tiny-hybrid-moe", "mxfp8"): (9175040, 286720)}


def skyrl_case(model, recipe, fp8_param):
    """A case of SkyRL's real configuration: the exclusion SkyRL's Qwen3.5 spec applies (GDN in_proj_a / in_proj_b,
    the router and the shared-expert gate in BF16), as fp8check derives it for a SkyRL job."""
    ex = tuple(skyrl_exclusion(get_model(model), WIRE[recipe]))
    mark = pytest.mark.fp8check(model=model, recipe=recipe, default_exclude=False, exclude=ex,
                                trainer=TrainerConfig(fp8_param=fp8_param))
    return pytest.param(model, recipe, fp8_param, marks=mark,
                        id=f"{model}-{recipe}" + ("-fp8_param" if fp8_param else ""))


CASES = [skyrl_case(m, r, p) for m in MODELS for r in (FP32, POW2, MX) for p in (False, True)]


def failing(e):
    return {f.invariant_id for f in e.findings if f.verdict == "fail"}


# -- counting bytes, in plain torch (no fp8check code) ---------------------------------------------------------------
def _scale_of(sent: dict, weight: str):
    """The scale SkyRL sent for `weight`, under either wire's name (blockwise weight_scale_inv, mxfp8
    weight_scale), as raw bytes of its dtype."""
    for name in (weight + "_scale_inv", weight + "_scale"):
        if name in sent:
            return sent[name]
    return None


def byte_diff(sent: dict, learner: dict) -> dict:
    """SkyRL's wire against the learner's FP8 forward bytes: codes and scales that differ, and how (fp32 scales:
    the largest distance in ulps; power-of-two and E8M0 scales: the factors sent / learner)."""
    codes = scales = 0
    n_codes = n_scales = 0
    ulps, factors = 0, set()
    for name, t in sent.items():
        if t.dtype != torch.float8_e4m3fn:
            continue
        mine = learner[name]
        codes += int((t.view(torch.uint8) != mine.view(torch.uint8)).sum())
        n_codes += t.numel()
        s, ref = _scale_of(sent, name), learner[name + "_scale_inv"]
        n_scales += s.numel()
        if s.dtype == torch.float32:
            a, b = s.view(torch.int32).long(), ref.view(torch.int32).long()
            diff = a != b
            scales += int(diff.sum())
            if diff.any():
                ulps = max(ulps, int((a - b).abs().max()))
                ratio = (s[diff] / ref[diff]).unique()
                if all(float(x) in (0.5, 2.0, 0.25, 4.0) for x in ratio):
                    factors |= {float(x) for x in ratio}
        else:                                    # E8M0 exponents: uint8 on SkyRL's wire, e8m0fnu in the learner's
            a, b = s.view(torch.uint8).int(), ref.view(torch.uint8).int()
            diff = a != b
            scales += int(diff.sum())
            factors |= {2.0 ** float(x) for x in (a - b)[diff].unique()}
    return {"codes": codes, "scales": scales, "n_codes": n_codes, "n_scales": n_scales, "ulps": ulps,
            "factors": factors}


def size_of(d: dict) -> str:
    if not d["scales"]:
        return "-"
    if d["factors"]:
        return " ".join(f"x{'1/' if f < 1 else ''}{int(f if f >= 1 else 1 / f)}" for f in sorted(d["factors"]))
    return "1 ulp" if d["ulps"] == 1 else f"up to {d['ulps']} ulps"


# -- the loader and SkyRL's spec (no fp8check yet: the mechanism the findings below follow from) ---------------------
def test_skyrl_runs_from_its_wheel():
    import sys
    s = skyrl_loader.load()
    whl = skyrl_loader.wheel_path()
    assert all(m.__file__.startswith(whl + os.sep) for m in vars(s).values())
    assert getattr(sys.modules["skyrl.backends"], "__file__", None) is None     # the stand-in: its __init__ never ran
    assert s.fp8.registered_fp8_spec_names() == ("qwen3.5",)
    # what stands in for absent packages is named: loguru (and vLLM's weight-transfer base, without vLLM)
    assert set(skyrl_loader.shims()) <= {"loguru", "vllm.distributed.weight_transfer.base"}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("wire", ["blockwise", "mxfp8"])
def test_fp8check_reads_skyrl_spec_as_skyrl_does(model, wire):
    """fp8check's table of SkyRL's spec (harness/jobconfig/skyrl_spec.py, what pre-flight judges a SkyRL job by) is
    SkyRL's own `should_quantize` on every GEMM of the model, and the engine's ignored_layers SkyRL computes are
    its high-precision GEMMs less those vLLM builds unquantized anyway (router, shared-expert gate)."""
    s = skyrl_loader.load()
    spec = get_model(model)
    qwen = s.fp8.resolve_fp8_spec(skyrl_sync.hf_config(spec))
    assert qwen is not None and qwen.name == "qwen3.5"
    theirs = []
    for t in spec.tensors():
        if t.kind != LINEAR:
            continue
        batched = qwen.moe_expert_spec(t.name.split(".mlp.experts.")[0] + ".mlp.experts.gate_up_proj") \
            if ".mlp.experts." in t.name else None
        if not (batched is not None or qwen.should_quantize(t.name, t.shape, wire)) and t.module not in theirs:
            theirs.append(t.module)
    assert skyrl_exclusion(spec, wire) == theirs
    ignored = set(qwen.ignored_layers(skyrl_sync.hf_config(spec), wire))
    forced = {m for m in theirs if m.endswith((".mlp.gate", ".mlp.shared_expert_gate"))}
    assert ignored & {t.module for t in spec.tensors()} == set(theirs) - forced
    assert any(m.endswith("linear_attn.in_proj_a") for m in ignored)


def test_batched_expert_wire_goes_through_skyrl_receiver_map():
    """On the MoE model SkyRL keeps the expert dimension on the wire: per layer six tensors named
    `__skyrl_batched_moe_fp8__:<layer>.mlp.experts.{gate,up,down}_proj.weight[_scale_inv]`, which its receiver
    routes by `batched_moe_wire_targets()` to w13 (shards w1, w3) and w2."""
    from fp8check.harness.config import recommended_config
    s = skyrl_loader.load()
    cfg = recommended_config("tiny-hybrid-moe", FP32)
    spec = cfg.spec
    masters = {t.name: torch.zeros(t.shape, dtype=torch.bfloat16) for t in spec.tensors()}
    stream = list(s.sources.SerializedFp8WeightSource(list(skyrl_sync.bridge_export(spec, {}, masters, cfg.recipe,
                                                                                      False)),
                                                      skyrl_sync.serialized_config(spec, cfg.recipe)))
    batched = [n for n, _ in stream if n.startswith(s.vllm_format.SKYRL_BATCHED_MOE_FP8_PREFIX)]
    assert len(batched) == 6 * spec.num_layers
    got = []
    skyrl_sync.receive([(n, t) for n, t in stream if n in batched], got.extend)
    assert len(got) == 6 * spec.num_layers * spec.num_experts
    assert {n for n, _ in got} == {f"{spec.layer_prefix(i)}mlp.experts.{e}.{p}.{leaf}" for i in range(spec.num_layers)
                                   for e in range(spec.num_experts) for p in ("gate_proj", "up_proj", "down_proj")
                                   for leaf in ("weight", "weight_scale_inv")}


# -- the cases ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model,recipe,fp8_param", CASES)
def test_skyrl_sync(request, fp8check_sync, fp8check_config, fp8check_trainer, model, recipe, fp8_param):
    """The verdicts and the byte counts of TABLE[model, recipe, fp8_param].

    Every case: S6 first -- SkyRL's Qwen3.5 spec keeps GDN in_proj_a / in_proj_b in BF16 in vLLM (the 32-row shard
    is not 128-divisible; MXFP8 kernels need 128 output rows), while Megatron-Core's GDN in_proj [q|k|v|z|b|a] is one
    Transformer Engine GEMM, quantized whole: the learner runs a and b in FP8, the sampler in BF16.

    FP32 scales: SkyRL computes scale_inv = amax / 448 and codes = e4m3(x / scale_inv); Transformer Engine computes
    scale = 448 / amax (one correctly rounded division), scale_inv = 1 / scale and codes = e4m3(x * scale). The two
    scale_inv roundings differ by one ulp in 40 % of the blocks (S3), and x / scale_inv vs x * scale moves the
    codes next to a rounding midpoint one E4M3 step (S2, 0.7 to 0.9 per 1000); the dequantized weights then differ
    (S4).

    Power-of-two scales and MXFP8: SkyRL rounds the scale up, 2^ceil(log2(amax / 448)), which is TE's rule
    (2^floor(log2(448 / amax)) for the scale, exact reciprocal) on these weights: the bytes are TE's; only the
    exclusion split fails.

    Persistent FP8 parameters (fp8_param): Megatron-Bridge exports the FP8 parameters dequantized to BF16, and
    SkyRL quantizes that export again. FP32: the BF16 rounding of the dequantized block moves its amax, so every
    block's scale differs (S3), by up to 0.44 %; the codes come back the same, the dequantized values do not (S4).
    Power-of-two and MXFP8: the BF16 export is exact, but a block (group) whose largest code TE rounded down to 224
    has amax / 448 = scale_inv / 2 exactly, and SkyRL's ceil picks that half scale: its codes double (S2) and its
    scale halves (S3), the same values (no S4)."""
    row = TABLE[model, recipe, fp8_param]
    if request.config.getoption("--fp8check-live") and recipe == MX:
        pytest.skip("MXFP8 GEMMs need sm100 (Blackwell): vLLM 0.26 on Hopper cannot serve this recipe; the CPU "
                    "mirror judges it")
    sent = {}

    def recording_sync(weights, masters, load):
        def loading(items):
            sent.update(items)
            load(items)
        skyrl_sync.sync_for(fp8check_config)(weights, masters, loading)

    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(recording_sync)
    first = next(f for f in e.value.findings if f.verdict == "fail")
    assert first.invariant_id == "S6" and first.evidence.get("stage") == "config"
    assert "in_proj_b" in first.message and "in_proj_a" in first.message and "in_proj" in first.tensor
    assert " ".join(sorted(failing(e.value))) == row.fails
    d = byte_diff(sent, fp8check_trainer.export_hf())
    assert (d["n_codes"], d["n_scales"]) == TOTALS[model, "mxfp8" if recipe == MX else "block"]
    assert (d["codes"], d["scales"], size_of(d)) == (row.codes, row.scales, row.size)


# -- the README's table is this table ---------------------------------------------------------------------------------
def readme_row(model, recipe, fp8_param, row) -> str:
    total_codes, total_scales = TOTALS[model, "mxfp8" if recipe == MX else "block"]
    return (f"| {model} | {recipe} | {'yes' if fp8_param else 'no'} | {row.fails} | "
            f"{row.codes:,} of {total_codes:,} | {row.scales:,} of {total_scales:,} | {row.size} |")


def test_readme_table_is_the_asserted_table():
    with open(os.path.join(HERE, "README.md")) as f:
        lines = {ln.strip() for ln in f if re.match(r"\| tiny-hybrid", ln)}
    want = {readme_row(*k, v) for k, v in TABLE.items()}
    assert lines == want, f"README rows not in TABLE: {sorted(lines - want)}\nTABLE rows not in README: " \
                          f"{sorted(want - lines)}"
