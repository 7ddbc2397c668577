"""`fp8check preflight`: how each stack's keys resolve, --explain, bad input, and a parser fuzz (the per-rule
passing / failing configs are tests/test_preflight_rules.py)."""
import json
import subprocess
import sys

import pytest
import yaml
from faker import Faker

from fp8check.harness.cli import main

HOPPER = "examples/skyrl_hopper_fp8.yaml"
BLACKWELL = "examples/skyrl_blackwell_mxfp8.yaml"
CLEAN_ENV = ["--env", "NVTE_FP8_BLOCK_SCALING_FP32_SCALES=", "--env", "VLLM_USE_DEEP_GEMM_E8M0=",
             "--env", "NVTE_FP8_BLOCK_AMAX_EPSILON="]


def pre(tmp_path, capsys, cfg=None, path=HOPPER, sets=(), env=(), gpu="sm90"):
    if cfg is not None:
        path = str(tmp_path / "job.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
    argv = ["preflight", path, "--gpu", gpu, "--json", *CLEAN_ENV]
    for s in sets:
        argv += ["--set", s]
    for e in env:
        argv += ["--env", e]
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip().startswith("{") else None)


def errors(rep):
    return {ln["rule"] for ln in rep["lines"] if ln["level"] == "error"}


def test_examples_pass(tmp_path, capsys):
    rc, rep = pre(tmp_path, capsys)
    assert rc == 0 and rep["recipe"] == "blockwise-fp32" and rep["sync_mode"] == "onpolicy", errors(rep)
    rc, rep = pre(tmp_path, capsys, path=BLACKWELL, gpu="sm100", env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"])
    assert rc == 0 and rep["recipe"] == "mxfp8", errors(rep)


def test_verl_config_resolves_like_verl(tmp_path, capsys):
    cfg = {"actor_rollout_ref": {"actor": {"megatron": {"override_transformer_config": {"fp8": "e4m3", "fp8_recipe": "blockwise"}}},
                                 "rollout": {"quantization": "fp8"}, "model": {"path": "tiny-dense"}}}
    rc, rep = pre(tmp_path, capsys, cfg=cfg)
    # verl's rollout writes FP32 block scales from the BF16 it receives; verl sets no NVTE variable, so the trainer
    # runs Transformer Engine's power-of-two default (C6, and V3: verl's docs require FP32 scales)
    assert rep["recipe"] == "blockwise-fp32" and rep["sync_mode"] == "naive"
    assert {"K5", "C6", "V3", "C2"} <= errors(rep)
    rc, rep = pre(tmp_path, capsys, cfg=cfg, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1", "VLLM_USE_DEEP_GEMM_E8M0=0"])
    assert errors(rep) == {"K5"}


def test_auto_recipe_resolves_by_gpu(tmp_path, capsys):
    s = ["trainer.policy.megatron_config.transformer_config_kwargs.fp8_recipe=auto",
         "generator.inference_engine.fp8_weight_sync_mode=auto"]
    assert pre(tmp_path, capsys, sets=s)[1]["recipe"] == "blockwise-fp32"
    assert pre(tmp_path, capsys, sets=s, gpu="sm100", env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"])[1]["recipe"] == "mxfp8"


def test_model_config_json_by_path(tmp_path, capsys):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "hidden_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 12,
                                               "num_key_value_heads": 4, "intermediate_size": 4160, "vocab_size": 1000}))
    rc, rep = pre(tmp_path, capsys, sets=[f"trainer.policy.model.path={d}"])
    # 4160 is not a multiple of 128: gate/up/down cannot be block-quantized
    assert rc == 1 and "X4" in errors(rep)


def run_cli(*argv):
    p = subprocess.run([sys.executable, "-m", "fp8check", "preflight", *argv], capture_output=True, text=True)
    return p.returncode, p.stderr.strip()


@pytest.mark.parametrize("content,needle", [("trainer: [unclosed\n", "not valid YAML"),
                                            ("trainer.policy.megatron_config.tensor_model_parallel_size: two\n", "must be an integer"),
                                            ("trainer.policy.megatron_config.fp8_recipe: blockwize\n", "unknown FP8 recipe"),
                                            ("- a list\n", "top level must be a mapping")])
def test_bad_input_is_one_line_exit_2(tmp_path, content, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(content)
    rc, err = run_cli(str(p), "--gpu", "sm90")
    assert rc == 2 and needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_parser_fuzz_never_tracebacks(tmp_path):
    """Faker-made configs over the real key space: exit 0, 1 or 2, never an internal error."""
    from fp8check.harness.jobconfig import KNOWN
    fake = Faker()
    Faker.seed(7)
    keys = sorted(KNOWN)
    from fp8check.harness.cli import main as cli_main
    for i in range(60):
        cfg = {fake.random_element(keys): fake.random_element(
            [fake.word(), fake.pyint(0, 9), fake.pybool(), None, [fake.word()], "blockwise", "e4m3", "mxfp8"])
            for _ in range(fake.pyint(1, 6))}
        p = tmp_path / f"f{i}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli_main(["preflight", str(p), "--gpu", fake.random_element(["sm90", "sm100"])])
        assert rc in (0, 1, 2) and "internal error" not in err.getvalue(), (cfg, err.getvalue())


def test_probe_without_gpu_says_why(tmp_path, capsys):
    main(["preflight", HOPPER, "--gpu", "sm90", "--probe", "--json", *CLEAN_ENV])
    rep = json.loads(capsys.readouterr().out)
    probe = [ln for ln in rep["lines"] if ln["rule"] == "PROBE"]
    assert probe and probe[0]["level"] == "warning" and "skipped" in probe[0]["why"]


# -- --explain ----------------------------------------------------------------------------------------------------
def explain(capsys, *argv):
    rc = main(["preflight", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_explain_prints_the_rule_alone(capsys):
    from fp8check.invariants import REGISTRY
    rc, out, _ = explain(capsys, "--explain", "K3")
    inv = REGISTRY["K3"]
    assert rc == 0 and inv.condition[:40] in out.replace("\n", " ") and "source:" in out and "why:" in out
    assert "verdict" not in out


def test_explain_unknown_rule_is_one_line_exit_2(capsys):
    rc, _, err = explain(capsys, "--explain", "K99")
    err = err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "did you mean" in err and "Traceback" not in err


def test_explain_with_config_gives_verdict_and_provenance(capsys, tmp_path):
    rc, out, _ = explain(capsys, "--explain", "K8", HOPPER, "--gpu", "sm90", "--json",
                         "--set", "trainer.strategy=fsdp", *CLEAN_ENV)
    rep = json.loads(out)
    assert rc == 0 and rep["verdict"] == "fail" and rep["findings"][0]["key"] == "trainer.strategy"
    read = {r["reads"]: r for r in rep["read"]}
    assert read["key trainer.strategy"]["from"] == "--set" and read["key trainer.strategy"]["value"] == "fsdp"
    # without the --set the value comes from the file; removed from the file, from SkyRL's own default
    rc, out, _ = explain(capsys, "--explain", "K8", HOPPER, "--gpu", "sm90", "--json", *CLEAN_ENV)
    rep = json.loads(out)
    assert rep["verdict"] == "pass" and {r["reads"]: r for r in rep["read"]}["key trainer.strategy"]["from"] \
        == f"written in {HOPPER}"
    data = yaml.safe_load(open(HOPPER))
    del data["trainer"]["strategy"]
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    rc, out, _ = explain(capsys, "--explain", "K8", str(p), "--gpu", "sm90", "--json", *CLEAN_ENV)
    rep = json.loads(out)
    got = {r["reads"]: r for r in rep["read"]}["key trainer.strategy"]
    assert rep["verdict"] == "fail" and got["value"] == "fsdp" and got["from"].startswith("SkyRL default")


def test_explain_config_rule_names_the_variables_it_read(capsys):
    rc, out, _ = explain(capsys, "--explain", "C2", HOPPER, "--gpu", "sm90", "--json", *CLEAN_ENV,
                         "--env", "VLLM_USE_DEEP_GEMM_E8M0=1")
    rep = json.loads(out)
    keys = {r["key"]: r for r in rep["read"]}
    assert rep["verdict"] == "fail"
    assert "VLLM_USE_DEEP_GEMM_E8M0" in keys and "(--env)" in keys["VLLM_USE_DEEP_GEMM_E8M0"]["value"]
    assert "VLLM_USE_DEEP_GEMM" in keys and "NVTE_FP8_BLOCK_SCALING_FP32_SCALES" in keys


def test_explain_text_output(capsys):
    rc, out, _ = explain(capsys, "--explain", "n1", "examples/nemo_rl_fp8_generation.yaml", "--gpu", "sm90",
                         "--set", "loss_fn.use_importance_sampling_correction=false", *CLEAN_ENV)
    assert rc == 0 and "verdict on examples/nemo_rl_fp8_generation.yaml (nemo-rl, judged against NeMo RL @7ea279ab): fail" in out
    assert "loss_fn.use_importance_sampling_correction = False  <- --set" in out


# -- NeMo RL --------------------------------------------------------------------------------------------------------
def test_nemo_defaults_chain_and_interpolation(tmp_path, capsys):
    """A child recipe inherits from a local parent (NeMo RL's load_config_with_inheritance); ${policy.precision}
    resolves within the merged job; the verdict names where each value came from."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "policy": {"precision": "fp8", "model_name": "tiny-dense",
                   "generation": {"vllm_cfg": {"precision": "${policy.precision}", "use_deep_gemm": True}},
                   "megatron_cfg": {"enabled": True}, "dtensor_cfg": {"enabled": False}},
        "loss_fn": {"use_importance_sampling_correction": True}}))
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"defaults": "base.yaml", "loss_fn": {"use_importance_sampling_correction": False}}))
    rc = main(["preflight", str(child), "--gpu", "sm90", "--json", "--explain", "N1", *CLEAN_ENV])
    rep = json.loads(capsys.readouterr().out)
    read = {r["reads"]: r for r in rep["read"]}
    assert rc == 0 and rep["verdict"] == "fail" and rep["stack"] == "nemo-rl"
    prec = read["key policy.generation.vllm_cfg.precision"]
    assert prec["value"] == "fp8" and "${policy.precision}" in prec["from"] and "base.yaml" in prec["from"]
    assert read["key loss_fn.use_importance_sampling_correction"]["from"] == f"written in {child}"


def test_nemo_missing_parent_is_named(tmp_path, capsys):
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"defaults": "grpo_math_8B_megatron.yaml",
                                     "policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}))
    rc, rep = pre(tmp_path, capsys, path=str(child))
    k20 = [ln for ln in rep["lines"] if ln["rule"] == "K20" and ln["level"] == "warning"]
    assert k20 and k20[0]["key"] == "defaults: grpo_math_8B_megatron.yaml"


def test_nemo_use_deep_gemm_forces_e8m0(capsys, tmp_path):
    """use_deep_gemm: true sets VLLM_USE_DEEP_GEMM_E8M0=0 in the vLLM worker over the environment; false sets
    nothing, so vLLM's default (and the environment) decide."""
    ne = "examples/nemo_rl_fp8_generation.yaml"
    rc, rep = pre(tmp_path, capsys, path=ne, env=["VLLM_USE_DEEP_GEMM_E8M0=1"])
    assert rc == 0 and rep["resolved"]["rollout.deep_gemm_e8m0"][1].startswith("0 (forced by NeMo RL")
    rc, rep = pre(tmp_path, capsys, path=ne, sets=["policy.generation.vllm_cfg.use_deep_gemm=false"],
                  env=["VLLM_USE_DEEP_GEMM_E8M0=1"])
    assert rc == 1 and "C2" in errors(rep) and rep["resolved"]["rollout.deep_gemm_e8m0"][1] == "1 (--env)"


def test_nemo_worker_env_vars_win_over_the_driver(capsys, tmp_path):
    ne = "examples/nemo_rl_fp8_generation.yaml"
    rc, rep = pre(tmp_path, capsys, path=ne, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"],
                  sets=["policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"])
    src, val = rep["resolved"]["trainer.scale_format"]
    assert src == "policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES" and val.startswith("1")


@pytest.mark.parametrize("sets,needle", [
    (["policy.generation.vllm_cfg.is_mx=maybe"], "policy.generation.vllm_cfg.is_mx must be bool"),
    (["policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES=2"], "must be 0 or 1"),
    (["policy.megatron_cfg.fp8_cfg.fp8_recipe=blockwize"], "unknown FP8 recipe"),
])
def test_nemo_bad_input_is_one_line_exit_2(sets, needle, capsys):
    argv = ["preflight", "examples/nemo_rl_fp8_generation.yaml", "--gpu", "sm90"]
    for s in sets:
        argv += ["--set", s]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err


def test_unknown_fp8_variable_is_named(tmp_path, capsys):
    rc, rep = pre(tmp_path, capsys, env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALE=1"])
    k1 = [ln for ln in rep["lines"] if ln["rule"] == "K1" and ln["level"] == "error"]
    assert k1 and k1[0]["key"] == "NVTE_FP8_BLOCK_SCALING_FP32_SCALE" and \
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES" in k1[0]["fix"]


def test_nemo_renamed_pow2_key_is_named(tmp_path, capsys):
    rc, rep = pre(tmp_path, capsys, path="examples/nemo_rl_fp8_generation.yaml",
                  sets=["policy.generation.vllm_cfg.use_weight_pow2_scale=true"])
    k1 = [ln for ln in rep["lines"] if ln["rule"] == "K1"]
    assert rc == 1 and "pow2_weight_scaling_factors" in k1[0]["fix"]


def test_skyrl_blockwise_wire_warns_about_its_formula(tmp_path, capsys):
    rc, rep = pre(tmp_path, capsys)
    assert rc == 0 and any(ln["rule"] == "E3" and ln["level"] == "warning" for ln in rep["lines"])


@pytest.mark.parametrize("argv", [
    # SkyRL: power-of-two wire scales on Blackwell with the pin turned off (utils.py:968-981)
    dict(sets=["generator.inference_engine.fp8_weight_sync_mode=blockwise",
               "trainer.policy.megatron_config.transformer_config_kwargs.fp8_recipe=blockwise"],
         env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0", "VLLM_USE_DEEP_GEMM_E8M0=0"], gpu="sm100"),
    # NeMo RL: use_deep_gemm forces E8M0=0, which Blackwell's DeepGEMM rejects
    dict(path="examples/nemo_rl_fp8_generation.yaml", gpu="sm100",
         sets=["policy.generation.vllm_cfg.pow2_weight_scaling_factors=true"]),
])
def test_blackwell_deep_gemm_needs_e8m0(tmp_path, capsys, argv):
    rc, rep = pre(tmp_path, capsys, **argv)
    assert rc == 1 and "K14" in errors(rep), errors(rep)


def test_config_from_job_is_what_preflight_reads():
    """The public call gives the SyncConfig pre-flight judges (one reader, not two)."""
    import argparse
    import fp8check
    from fp8check.harness.cli.preflight import read_job
    for path in ("examples/skyrl_hopper_fp8.yaml", "examples/verl_fp8_rollout.yaml", "examples/nemo_rl_fp8_generation.yaml"):
        args = argparse.Namespace(config=path, set=None, env=None, gpu="sm90")
        got = fp8check.config_from_job(path, gpu="sm90")
        want = read_job(args).config
        assert got.to_dict() == want.to_dict(), path


def test_config_from_job_bad_input_is_one_line():
    import fp8check
    from fp8check.harness.errors import BadInput
    with pytest.raises(BadInput) as e:
        fp8check.config_from_job("no/such/job.yaml")
    assert "no/such/job.yaml" in str(e.value) and "\n" not in str(e.value)
