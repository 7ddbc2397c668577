"""`fp8check preflight`: one passing and one failing config per rule, bad input, and a parser fuzz."""
import json
import subprocess
import sys

import pytest
import yaml
from faker import Faker

from harness.cli import main

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


@pytest.mark.parametrize("name,argv,rule", [
    ("fp32 scales with E8M0 requant", dict(env=["VLLM_USE_DEEP_GEMM_E8M0=1"]), "C2"),
    ("fp8_param with power-of-two scales",
     dict(sets=["trainer.policy.megatron_config.transformer_config_kwargs.fp8_param=true",
                "trainer.policy.megatron_config.ddp_config.fp8_param_gather=true"],
          env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"]), "C4"),
    ("Blackwell with FP32 scales", dict(sets=["trainer.policy.megatron_config.transformer_config_kwargs.fp8_recipe=blockwise",
                                              "generator.inference_engine.fp8_weight_sync_mode=blockwise"],
                                        env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1"], gpu="sm100"), "C3"),
    ("trainer and recipe epsilon disagree", dict(env=["NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4"]), "C6"),
    ("LoRA adapter-only with serialized FP8 sync", dict(sets=["trainer.policy.model.lora.rank=16",
                                                               "trainer.policy.megatron_config.lora_config.merge_lora=false"]), "C8"),
    ("mxfp8 with fp8_param", dict(path=BLACKWELL, gpu="sm100", env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"],
                                  sets=["trainer.policy.megatron_config.transformer_config_kwargs.fp8_param=true"]), "C4"),
    ("mxfp8 on Hopper", dict(sets=["trainer.policy.megatron_config.transformer_config_kwargs.fp8_recipe=mxfp8",
                                   "generator.inference_engine.fp8_weight_sync_mode=mxfp8"]), "C5"),
    ("TP that breaks 128-divisibility", dict(sets=["generator.inference_engine.tensor_parallel_size=4"]), "A2"),
    ("mismatched exclusion lists", dict(sets=[
        "generator.inference_engine.engine_init_kwargs.hf_overrides.quantization_config.ignored_layers="
        "[model.layers.0.mlp.gate]"]), "X6"),
    ("substring exclusion", dict(sets=["fp8check.exclude=['re:.*gate.*']"]), "X1"),
    ("packing multiples disagree", dict(sets=["fp8check.packing.replay_multiple=8"]), "A3"),
    ("engine block shape", dict(sets=[
        "generator.inference_engine.engine_init_kwargs.hf_overrides.quantization_config.weight_block_size=[128, 64]"]), "C7"),
    ("power-of-two weights, FP32 activations", dict(env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0",
                                                          "VLLM_USE_DEEP_GEMM_E8M0=0"]), "C9"),
    ("BF16 sync of an FP8 learner", dict(sets=["generator.inference_engine.fp8_weight_sync_mode=null"]), "K5"),
    ("unknown FP8 key", dict(sets=["trainer.policy.megatron_config.transformer_config_kwargs.fp8_recipie=blockwise"]), "K1"),
    ("fp8_param without fp8_param_gather", dict(sets=[
        "trainer.policy.megatron_config.transformer_config_kwargs.fp8_param=true"]), "K7"),
    ("FP8 sync with FSDP", dict(sets=["trainer.strategy=fsdp"]), "K8"),
])
def test_rule_fails(tmp_path, capsys, name, argv, rule):
    rc, rep = pre(tmp_path, capsys, **argv)
    assert rc == 1 and rule in errors(rep), (name, errors(rep))


def test_verl_config_resolves_like_verl(tmp_path, capsys):
    cfg = {"actor_rollout_ref": {"actor": {"megatron": {"override_transformer_config": {"fp8": "e4m3", "fp8_recipe": "blockwise"}}},
                                 "rollout": {"quantization": "fp8"}, "model": {"path": "tiny-dense"}}}
    rc, rep = pre(tmp_path, capsys, cfg=cfg)
    # verl sets no NVTE variable: Transformer Engine's power-of-two default; BF16 goes over the wire
    assert rep["recipe"] == "blockwise-pow2" and rep["sync_mode"] == "naive" and "K5" in errors(rep)


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
    p = subprocess.run([sys.executable, "-m", "harness", "preflight", *argv], capture_output=True, text=True)
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
    from harness.jobconfig import KNOWN
    fake = Faker()
    Faker.seed(7)
    keys = sorted(KNOWN)
    from harness.cli import main as cli_main
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
