"""Pre-flight against SkyRL 0.4.0 as released: every place SkyRL 0.4.0 refuses an FP8 configuration
(harness.jobconfig.versions.SKYRL_REFUSALS) is a pre-flight error whose line cites SkyRL's file and line; the
release judged is named in the output; the names of SkyRL's unreleased FP8 branch get one message with the versions
that accept them; a misspelt engine_init_kwargs key gets a did-you-mean from vLLM's own argument names, whose table
is held to vLLM 0.26.0's source."""
import ast
import importlib.util
import json
import os

import pytest

import fp8check.harness.jobconfig as jobconfig
from fp8check.harness.cli import main
from fp8check.harness.jobconfig.versions import SKYRL_REFUSALS
from fp8check.harness.jobconfig.vllm_args import ENGINE_ARGS, FRONTEND_ARGS, VLLM_VERSION

SK, SKB = "examples/skyrl_hopper_fp8.yaml", "examples/skyrl_blackwell_mxfp8.yaml"
T = "trainer.policy.megatron_config.transformer_config_kwargs."
IE = "generator.inference_engine."
EIK = IE + "engine_init_kwargs."
QC = EIK + "hf_overrides.quantization_config."
GATHER = "trainer.policy.megatron_config.ddp_config.fp8_param_gather=true"
MX = [IE + "fp8_weight_sync_mode=mxfp8", T + "fp8_recipe=mxfp8"]
QWEN35 = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 4096,
          "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
          "intermediate_size": 12288, "vocab_size": 1024, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
          "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
          "linear_value_head_dim": 128}
MOE_ODD = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 1024, "moe_intermediate_size": 336, "num_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 1024}


def job(path=SK, sets=(), env=(), gpu="sm90", gpu_seen=None, model=None):
    return dict(path=path, sets=list(sets), env=list(env), gpu=gpu, gpu_seen=gpu_seen, model=model)


# each refusal of SkyRL 0.4.0 -> a job that SkyRL 0.4.0 refuses for that reason alone (besides K19's missing spec)
REFUSED = {
    "unsupported-wire": job(sets=[IE + "fp8_weight_sync_mode=serialized_blockwise"]),
    "quantization-forced": job(sets=[EIK + "quantization=compressed-tensors"]),
    "fp8-param-gather": job(sets=[T + "fp8_param=true"]),
    "fp8-sync-needs-megatron": job(sets=["trainer.strategy=fsdp"]),
    "load-format-dummy": job(sets=[EIK + "load_format=auto"]),
    "quantization-config-injected": job(sets=[QC + "activation_scheme=static"]),
    "mxfp8-gdn-tp": job(SKB, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"], gpu="sm100", model=QWEN35,
                        sets=["trainer.policy.megatron_config.tensor_model_parallel_size=4"]),
    "fp32-scales-e8m0": job(env=["VLLM_USE_DEEP_GEMM_E8M0=1"]),
    "pow2-scales-e8m0": job(env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0", "VLLM_USE_DEEP_GEMM_E8M0=0"]),
    "auto-wire-auto-recipe": job(SKB, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"], gpu="auto"),
    "sync-backend": job(sets=[IE + "weight_sync_backend=sharded_rdt"]),
    "megatron-backends": job(sets=[IE + "weight_sync_backend=gloo"]),
    "megatron-serves-vllm": job(sets=[IE + "backend=sglang"]),
    "model-spec": job(),
    "mxfp8-experts-k": job(SKB, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"], gpu="sm100", model=MOE_ODD),
    "mx-cast-backend": job(SKB, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0", "SKYRL_MX_CAST_BACKEND=te"], sets=MX),
    "speculative-decoding": job(sets=[IE + "speculative_config={method: mtp, num_speculative_tokens: 1}"]),
    "gpu-less-driver": job(gpu="auto"),
    "ignored-layers-override": job(sets=[QC + "ignored_layers=[model.layers.0.mlp.gate]"]),
    "pow2-scales-fp8-param": job(sets=[T + "fp8_param=true", GATHER], env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"]),
    "mxfp8-fp8-param": job(SKB, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"], gpu="sm100",
                           sets=[T + "fp8_param=true", GATHER]),
    "mxfp8-pre-blackwell": job(sets=MX),
    "unmerged-lora": job(sets=["trainer.policy.model.lora.rank=16",
                               "trainer.policy.megatron_config.lora_config.merge_lora=false"]),
}
# a spec can be registered from the user's own code (register_fp8_spec), which pre-flight cannot see
WARNING_ONLY = {"model-spec"}


@pytest.fixture
def run(monkeypatch, capsys, tmp_path):
    """(exit code, the JSON report) of `fp8check preflight` on one job of the table, this machine's FP8 variables
    left out."""
    for k in list(os.environ):
        if k.startswith(("NVTE_", "VLLM_", "SKYRL_")):
            monkeypatch.delenv(k)

    def go(c):
        monkeypatch.setattr(jobconfig, "detect_gpu", lambda: c["gpu_seen"])
        argv = ["preflight", c["path"], "--gpu", c["gpu"], "--json"]
        sets = list(c["sets"])
        if c["model"] is not None:
            (tmp_path / "config.json").write_text(json.dumps(c["model"]))
            sets.append(f"trainer.policy.model.path={tmp_path}")
        for s in sets:
            argv += ["--set", s]
        for e in c["env"]:
            argv += ["--env", e]
        rc = main(argv)
        return rc, json.loads(capsys.readouterr().out)
    return go


def test_the_table_covers_every_refusal():
    assert set(REFUSED) == set(SKYRL_REFUSALS)


@pytest.mark.parametrize("condition", sorted(SKYRL_REFUSALS))
def test_each_skyrl_refusal_is_an_error_citing_skyrls_file_and_line(run, condition):
    rule, first_site = SKYRL_REFUSALS[condition][0], SKYRL_REFUSALS[condition][1]
    rc, rep = run(REFUSED[condition])
    lines = [ln for ln in rep["lines"] if ln["rule"] == rule and ln["level"] != "ok"]
    assert lines, (condition, rule, [ln for ln in rep["lines"] if ln["level"] != "ok"])
    cited = [ln for ln in lines if first_site in ln["why"]]
    assert cited, (condition, first_site, lines)
    want = "warning" if condition in WARNING_ONLY else "error"
    assert {ln["level"] for ln in cited} == {want}, cited
    if want == "error":
        assert rc == 1
    assert rep["judged_against"].startswith("SkyRL 0.4.0")


@pytest.mark.parametrize("condition", ["fp8-param-gather", "sync-backend", "unmerged-lora", "speculative-decoding"])
def test_a_job_skyrl_accepts_draws_no_such_error(run, condition):
    """The other half: with the one setting fixed, the rule holds (no citation of that site)."""
    fixed = {"fp8-param-gather": job(sets=[T + "fp8_param=true", GATHER]),
             "sync-backend": job(sets=[IE + "weight_sync_backend=nccl"]),
             "unmerged-lora": job(sets=["trainer.policy.model.lora.rank=16"]),
             "speculative-decoding": job(sets=["trainer.mtp.enabled=true"], env=["SKYRL_DISABLE_SPEC=1"])}[condition]
    rc, rep = run(fixed)
    rule = SKYRL_REFUSALS[condition][0]
    assert [ln["level"] for ln in rep["lines"] if ln["rule"] == rule] == ["ok"]
    assert rc == 0


def test_the_release_judged_is_named(run, capsys, monkeypatch):
    _, rep = run(job())
    assert rep["judged_against"] == "SkyRL 0.4.0 (PyPI skyrl==0.4.0)"
    main(["preflight", SK, "--gpu", "sm90"])
    assert "(skyrl, judged against SkyRL 0.4.0 (PyPI skyrl==0.4.0))" in capsys.readouterr().out


def test_the_skyrl_article_job_gets_one_message_naming_the_versions(run):
    """The SkyRL FP8 article's names: fp8_weight_sync_mode=serialized_blockwise and NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4.
    One line (K2) names both, which SkyRL accepts them (only PR #1898's branch before 42e8eec3 / 0010f48d) and which
    do not (0.1.0-0.3.0: no FP8 weight sync; 0.4.0 raises); E7 does not repeat the variable."""
    rc, rep = run(job(sets=[IE + "fp8_weight_sync_mode=serialized_blockwise"],
                      env=["NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4"]))
    about = [ln for ln in rep["lines"] if ln["level"] != "ok" and
             ("serialized_blockwise" in f"{ln['value']} {ln['why']}" or "AMAX_EPSILON" in f"{ln['key']} {ln['why']}")]
    assert [ln["rule"] for ln in about] == ["K2"], about
    why = about[0]["why"]
    for s in ("serialized_blockwise", "NVTE_FP8_BLOCK_AMAX_EPSILON", "#1898", "42e8eec3", "0010f48d", "e04ff1ab",
              "0.1.0, 0.2.0 and 0.3.0", "0.4.0 raises", "config.py:1922-1926"):
        assert s in why, s
    assert about[0]["level"] == "error" and rc == 1


def test_the_article_variable_alone_is_a_warning_with_the_same_history(run):
    rc, rep = run(job(env=["NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4"]))
    k2 = [ln for ln in rep["lines"] if ln["rule"] == "K2"]
    assert [ln["level"] for ln in k2] == ["warning"] and "0010f48d" in k2[0]["why"] and rc == 0
    assert [ln["level"] for ln in rep["lines"] if ln["rule"] == "E7"] == ["ok"]


@pytest.mark.parametrize("key,near", [("quantisation", "quantization"), ("gpu_memory_utilisation",
                                                                          "gpu_memory_utilization"),
                                      ("enforce_eagr", "enforce_eager")])
def test_a_misspelt_engine_init_kwargs_key_gets_a_did_you_mean(run, key, near):
    rc, rep = run(job(sets=[EIK + f"{key}=fp8"]))
    k1 = [ln for ln in rep["lines"] if ln["rule"] == "K1" and ln["level"] != "ok"]
    assert [(ln["key"], ln["fix"]) for ln in k1] == [(EIK + key, f"did you mean {EIK}{near}?")]
    assert rc == 1


def test_engine_init_kwargs_that_vllm_takes_pass(run):
    rc, rep = run(job(sets=[EIK + "gpu_memory_utilization=0.8", EIK + "enforce_eager=true",
                            EIK + "compilation_config={level: 0}", EIK + "chat_template=x.jinja"]))
    assert [ln["level"] for ln in rep["lines"] if ln["rule"] == "K1"] == ["ok"] and rc == 0


def _vllm_source() -> str | None:
    """vLLM 0.26.0's source: FP8CHECK_VLLM_SRC, an installed vllm 0.26.0 (found without importing it), or
    /tmp/src/vllm-0.26.0 (the unzipped wheel)."""
    for root in (os.environ.get("FP8CHECK_VLLM_SRC"),):
        if root and os.path.isfile(os.path.join(root, "vllm", "engine", "arg_utils.py")):
            return root
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        root = os.path.dirname(list(spec.submodule_search_locations)[0])
        try:
            from importlib.metadata import version
            if version("vllm") == VLLM_VERSION:
                return root
        except Exception:  # noqa: BLE001 - no metadata: not the version we read
            pass
    root = f"/tmp/src/vllm-{VLLM_VERSION}"
    return root if os.path.isfile(os.path.join(root, "vllm", "engine", "arg_utils.py")) else None


def _fields(path: str, classes: set) -> set:
    tree = ast.parse(open(path).read())
    return {s.target.id for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes
            for s in n.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            and not s.target.id.startswith("_")}


def test_the_vllm_argument_table_is_vllms_own():
    root = _vllm_source()
    if root is None:
        pytest.skip(f"vLLM {VLLM_VERSION}'s source is not here (set FP8CHECK_VLLM_SRC to an unzipped "
                    f"vllm=={VLLM_VERSION} wheel)")
    engine = _fields(os.path.join(root, "vllm", "engine", "arg_utils.py"), {"EngineArgs", "AsyncEngineArgs"})
    front = _fields(os.path.join(root, "vllm", "entrypoints", "openai", "cli_args.py"),
                    {"BaseFrontendArgs", "FrontendArgs"})
    assert ENGINE_ARGS == engine
    assert FRONTEND_ARGS == front - engine
    assert {"quantization", "load_format", "hf_overrides", "kv_cache_dtype"} <= ENGINE_ARGS
