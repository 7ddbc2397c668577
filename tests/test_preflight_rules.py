"""Every pre-flight rule (job rules and the C/X/A config rules) from one table: a config it passes and a config it
fails, run through `fp8check preflight` exactly as a user runs it. The table must cover every registered rule of
those families, every rule must cite its source, and every shipped example must pass."""
import json

import pytest
import yaml

import fp8check.harness.jobconfig as jobconfig
from fp8check.harness.cli import main
from fp8check.harness.jobconfig.keys import ENV_PREFIXES
from fp8check.invariants import REGISTRY, CheckContext, run_invariant

SK = "examples/skyrl_hopper_fp8.yaml"
SKB = "examples/skyrl_blackwell_mxfp8.yaml"
VE = "examples/verl_fp8_rollout.yaml"
NE = "examples/nemo_rl_fp8_generation.yaml"
T = "trainer.policy.megatron_config.transformer_config_kwargs."
IE = "generator.inference_engine."
EIK = IE + "engine_init_kwargs."
QC = EIK + "hf_overrides.quantization_config."
VR = "actor_rollout_ref.rollout."
VT = "actor_rollout_ref.actor.megatron.override_transformer_config."
VENV = "ray_kwargs.ray_init.runtime_env.env_vars."
NV = "policy.generation.vllm_cfg."
NM = "policy.megatron_cfg."
NF = NM + "fp8_cfg."
NEMO_FP8_TRAIN = [f"{NF}enabled=true", f"{NF}fp8=e4m3", f"{NF}fp8_recipe=blockwise", f"{NF}fp8_param=false"]
VERL_FP8_TRAIN = [f"{VT}fp8=hybrid", f"{VT}fp8_recipe=blockwise"]
SKB_ENV = ["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"]
# Qwen3.5-style hybrid text model: the fused GDN in_proj is 2*128*16 + 2*128*32 + 2*32 = 12352 rows
QWEN35 = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 4096,
          "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
          "intermediate_size": 12288, "vocab_size": 1024, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
          "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
          "linear_value_head_dim": 128}
# an MoE whose expert width is no multiple of 32 (K23), and the same with one that is
MOE_ODD = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 1024, "moe_intermediate_size": 336, "num_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 1024}
MOE_EVEN = {**MOE_ODD, "moe_intermediate_size": 384}
MX = [IE + "fp8_weight_sync_mode=mxfp8", T + "fp8_recipe=mxfp8"]
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1536, "num_hidden_layers": 2,
         "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 1000}


def case(path=SK, sets=(), env=(), gpu="sm90", gpu_seen="none", model=None, sync_config=None):
    """One config of the table: a job file plus --set / --env / --gpu, as on the command line. `gpu_seen`: what
    `--gpu auto` detects (none | sm90); `model`: a config.json to write and point the job's model key at;
    `sync_config`: a bare SyncConfig mapping (for the config rules no job key can reach)."""
    return dict(path=path, sets=list(sets), env=list(env), gpu=gpu, gpu_seen=gpu_seen, model=model,
                sync_config=sync_config)


def sk_model(model, path=SK):
    return {"path": path, "model": ("trainer.policy.model.path", model)}


# rule -> (a config it passes, a config it fails)
TABLE = {
    # -- job rules, any stack ------------------------------------------------------------------------------------
    "K1": (case(), case(sets=[T + "fp8_recipie=blockwise"])),
    "K3": (case(SKB, env=SKB_ENV, gpu="sm100"), case(SKB, env=SKB_ENV, gpu="sm100", sets=[IE + "fp8_weight_sync_mode=blockwise"])),
    "K5": (case(), case(sets=[IE + "fp8_weight_sync_mode=null"])),
    "K6": (case(), case(VE, sets=["algorithm.rollout_correction.rollout_is=null"])),
    "K9": (case(), case(sets=["trainer.ref.megatron_config.transformer_config_kwargs.fp8_recipe=mxfp8"])),
    "K12": (case(SKB, env=SKB_ENV, gpu="sm100"), case(env=SKB_ENV, gpu="sm100")),
    "K20": (case(NE), case(NE, sets=["policy.make_sequence_length_divisible_by=${mul:2,2}"])),
    "K21": (case(), case(sets=[T + "fp8_recipe=null"])),
    "K22": (case(), case(sets=[IE + "fp8_weight_sync_mode=null", IE + "engine_init_kwargs.quantization=null"])),
    "M1": (case(), case(sets=["trainer.policy.model.path=some-org/Unknown-Model-7B"])),
    "M2": (case(), case(sets=["trainer.policy.model.path=tiny-hybrid", EIK + "kv_cache_dtype=fp8"])),
    # -- SkyRL -----------------------------------------------------------------------------------------------------
    "K2": (case(), case(sets=[IE + "fp8_weight_sync_mode=serialized_blockwise"])),
    "K4": (case(), case(sets=[EIK + "quantization=compressed-tensors"])),
    "K7": (case(), case(sets=[T + "fp8_param=true"])),
    "K8": (case(), case(sets=["trainer.strategy=fsdp"])),
    "K10": (case(), case(sets=[EIK + "load_format=auto"])),
    "K11": (case(), case(sets=[QC + "activation_scheme=static"])),
    "K13": (case(SKB, env=SKB_ENV, gpu="sm100", model=QWEN35),
            case(SKB, env=SKB_ENV, gpu="sm100", model=QWEN35,
                 sets=["trainer.policy.megatron_config.tensor_model_parallel_size=4"])),
    "K14": (case(), case(env=["VLLM_USE_DEEP_GEMM_E8M0=1"])),
    "K15": (case(SKB, env=SKB_ENV, gpu="sm100"), case(SKB, env=SKB_ENV, gpu="auto", gpu_seen="none")),
    "K16": (case(), case(sets=[IE + "weight_sync_backend=delta"])),
    "K17": (case(), case(sets=[IE + "backend=sglang"])),
    "K19": (case(model=QWEN35), case()),
    "K23": (case(SKB, env=SKB_ENV, gpu="sm100", model=MOE_EVEN), case(SKB, env=SKB_ENV, gpu="sm100", model=MOE_ODD)),
    "K24": (case(SKB, env=SKB_ENV + ["SKYRL_MX_CAST_BACKEND=te"], gpu="sm100"),
            case(SKB, env=SKB_ENV + ["SKYRL_MX_CAST_BACKEND=te"], gpu="sm90", sets=MX)),
    "X6": (case(), case(sets=[QC + "ignored_layers=[model.layers.0.mlp.gate]"])),
    "K25": (case(sets=["trainer.mtp.enabled=true"], env=["SKYRL_DISABLE_SPEC=1"]),
            case(sets=["trainer.mtp.enabled=true"])),
    "K26": (case(gpu="auto", gpu_seen="none", env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1"]),
            case(gpu="auto", gpu_seen="none")),
    # -- verl ------------------------------------------------------------------------------------------------------
    "V1": (case(VE), case(VE, sets=[VR + "quantization=int8"])),
    "V2": (case(VE), case(VE, sets=["actor_rollout_ref.model.path=tiny-hybrid"])),
    "V3": (case(VE, sets=VERL_FP8_TRAIN + [VENV + "NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"]),
           case(VE, sets=VERL_FP8_TRAIN)),
    "V4": (case(VE), case(VE, sets=[VR + "engine_kwargs.vllm.hf_overrides={quantization_config: {quant_method: fp8}}"])),
    "V5": (case(VE, sets=[VR + "name=trtllm"]), case(VE, sets=[VR + "name=trtllm", VR + "load_format=auto"])),
    # -- NeMo RL ---------------------------------------------------------------------------------------------------
    "N1": (case(NE), case(NE, sets=["loss_fn.use_importance_sampling_correction=false"])),
    "N2": (case(NE, sets=[NV + "kv_cache_dtype=fp8"]), case(NE, sets=[NV + "kv_cache_dtype=fp8_e5m2"])),
    "N3": (case(NE, sets=[NV + "kv_cache_dtype=fp8"]),
           case(NE, sets=[NV + "kv_cache_dtype=fp8", "policy.dtensor_cfg.enabled=true"])),
    "N4": (case(NE, sets=[NV + "is_mx=true"]), case(NE, sets=[NV + "is_mx=true", NV + "pow2_weight_scaling_factors=false"])),
    "N5": (case(NE), case(NE, sets=[NV + "use_deep_gemm=false"])),
    "N6": (case(NE, sets=NEMO_FP8_TRAIN), case(NE, sets=[f"{NF}enabled=true"])),
    "N7": (case(NE), case(NE, sets=["policy.make_sequence_length_divisible_by=3"])),
    "N8": (case(NE, sets=[NV + "is_mx=true"]), case(NE, sets=[NV + "is_mx=true", NV + "tensor_parallel_size=16"])),
    "N9": (case(NE, sets=NEMO_FP8_TRAIN + [NV + "num_first_layers_in_bf16=1", NM + "first_last_layers_bf16=true",
                                           NM + "num_layers_at_start_in_bf16=1"]),
           case(NE, sets=NEMO_FP8_TRAIN + [NV + "num_first_layers_in_bf16=1"])),
    "N10": (case(NE), case(NE, sets=[NV + "quantization_ignored_layer_kws=[gate]"])),
    "N11": (case(NE), case(NE, sets=[NV + "quantization_ignored_layer_kws=[]"])),
    "N12": (case(NE), case(NE, sets=["policy.generation.backend=sglang"])),
    "N13": (case(NE), case(NE, sets=[f"{NF}enabled=true", f"{NM}enabled=false"])),
    # -- mistakes the stacks let through ---------------------------------------------------------------------------
    "E1": (case(gpu="auto", gpu_seen="sm90"), case(gpu="auto", gpu_seen="none")),
    "E2": (case(NE, sets=[NM + "env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"],
                env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1"]),
           case(NE, sets=[NM + "env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"],
                env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"])),
    "E3": (case(VE), case(VE, sets=[VENV + "VERL_DISABLE_TRITON_FP8='0'"])),
    "E4": (case(VE), case(VE, sets=[VR + "engine_kwargs.vllm.kv_cache_dtype=fp8"])),
    "E5": (case(), case(sets=["trainer.fully_async.enabled=true"])),
    "E6": (case(NE, gpu="sm100", sets=[f"{NF}enabled=true", f"{NF}fp8=e4m3", f"{NF}fp8_recipe=mxfp8",
                                       f"{NF}fp8_param=true"]),
           case(NE, gpu="sm100", sets=[f"{NF}enabled=true", f"{NF}fp8=e4m3", f"{NF}fp8_recipe=mxfp8",
                                       f"{NF}fp8_param=true", NM + "distributed_data_parallel_config.overlap_grad_reduce=false"])),
    "E7": (case(VE), case(VE, env=["NVTE_FP8_BLOCK_AMAX_EPSILON=1e-4"])),     # SkyRL jobs: K2 names it
    "E8": (case(), case(sets=[EIK + "kv_cache_dtype=fp8"])),
    # -- config rules over the SyncConfig the job resolves to -------------------------------------------------------
    "C2": (case(), case(env=["VLLM_USE_DEEP_GEMM_E8M0=1"])),
    "C3": (case(SKB, env=SKB_ENV, gpu="sm100"),
           case(gpu="sm100", env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1"])),
    "C4": (case(sets=[T + "fp8_param=true", "trainer.policy.megatron_config.ddp_config.fp8_param_gather=true"]),
           case(sets=[T + "fp8_param=true", "trainer.policy.megatron_config.ddp_config.fp8_param_gather=true"],
                env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"])),
    "C5": (case(), case(sets=[T + "fp8_recipe=mxfp8", IE + "fp8_weight_sync_mode=mxfp8"])),
    "C6": (case(NE, sets=NEMO_FP8_TRAIN + [NM + "env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"]),
           case(NE, sets=NEMO_FP8_TRAIN)),
    "C7": (case(), case(sets=[QC + "weight_block_size=[128, 64]"])),
    "C8": (case(), case(sets=["trainer.policy.model.lora.rank=16",
                              "trainer.policy.megatron_config.lora_config.merge_lora=false"])),
    "C9": (case(), case(env=["NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0", "VLLM_USE_DEEP_GEMM_E8M0=0"])),
    "X1": (case(), case(sets=["fp8check.exclude=['re:.*gate.*']"])),
    "X2": (case(), case(sets=["fp8check.exclude=[model.layers.0.self_attn.q_proj]"])),
    "X3": (case(), case(sets=["fp8check.exclude=[model.layers.0.mlp.experts.0.gate_proj]"])),
    "X4": (case(), case(model={**LLAMA, "intermediate_size": 4160})),
    "X5": (case(sync_config={"model": "tiny-moe", "default_exclude": False,
                             "exclude": ["mlp.gate", "mlp.shared_expert_gate"]}),
           case(sync_config={"model": "tiny-moe", "default_exclude": False, "exclude": ["mlp.gate"]})),
    "A1": (case(model={**LLAMA, "intermediate_size": 4096}), case(model={**LLAMA, "intermediate_size": 4104})),
    "A2": (case(), case(sets=[IE + "tensor_parallel_size=4"])),
    "A3": (case(), case(sets=["fp8check.packing.replay_multiple=8"])),
}
PREFLIGHT_FAMILIES = ("job", "contract", "exclusion", "alignment")


@pytest.fixture
def clean_env(monkeypatch):
    """The FP8 variables of this machine's environment must not leak into the verdicts."""
    import os
    for k in list(os.environ):
        if k.startswith(ENV_PREFIXES) or k in ("NVTE_BACKWARD_OVERRIDE", "SKYRL_MX_CAST_BACKEND", "SKYRL_DISABLE_SPEC"):
            monkeypatch.delenv(k)
    return monkeypatch


def run_case(c, tmp_path, capsys, monkeypatch):
    """(exit code, {rule: line level}) for one table config."""
    if c["sync_config"] is not None:
        from fp8check.harness.config import SyncConfig
        cfg = SyncConfig.from_dict(c["sync_config"])
        out = {}
        for inv in REGISTRY.values():
            if inv.family in PREFLIGHT_FAMILIES and inv.scope == "config":
                fs = run_invariant(inv, CheckContext(cfg))
                out[inv.id] = "ok" if all(f.verdict == "pass" for f in fs) else \
                    ("warning" if inv.severity == "warning" or any(f.verdict == "unknown" for f in fs) else "error")
        return (1 if "error" in out.values() else 0), out
    seen = {"none": None, "sm90": ("sm90", "NVIDIA H100 (test)")}[c["gpu_seen"]]
    monkeypatch.setattr(jobconfig, "detect_gpu", lambda: seen)
    path = c["path"]
    sets = list(c["sets"])
    if c["model"] is not None:
        d = tmp_path / "ckpt"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(c["model"]))
        key = {"examples/verl": "actor_rollout_ref.model.path", "examples/nemo": "policy.model_name"}.get(
            path[:13], "trainer.policy.model.path")
        sets.append(f"{key}={d}")
    argv = ["preflight", path, "--gpu", c["gpu"], "--json"]
    for s in sets:
        argv += ["--set", s]
    for e in c["env"]:
        argv += ["--env", e]
    rc = main(argv)
    out = capsys.readouterr().out
    rep = json.loads(out)
    levels: dict = {}
    rank = {"n/a": -1, "ok": 0, "warning": 1, "error": 2}
    for ln in rep["lines"]:
        if rank[ln["level"]] >= rank.get(levels.get(ln["rule"], "n/a"), -1):
            levels[ln["rule"]] = ln["level"]
    return rc, levels


CASES = [(rule, which, cfg) for rule, (good, bad) in TABLE.items() for which, cfg in (("passes", good), ("fails", bad))]


@pytest.mark.parametrize("rule,which,cfg", CASES, ids=[f"{r}-{w}" for r, w, _ in CASES])
def test_rule(rule, which, cfg, tmp_path, capsys, clean_env):
    rc, levels = run_case(cfg, tmp_path, capsys, clean_env)
    inv = REGISTRY[rule]
    if which == "passes":
        assert levels.get(rule) == "ok", (rule, levels.get(rule), {k: v for k, v in levels.items() if v != "ok"})
    else:
        assert levels.get(rule) == inv.severity, (rule, levels.get(rule))
        if inv.severity == "error":
            assert rc == 1


@pytest.mark.parametrize("rule,cfg", [
    ("K5", case(VE, sets=VERL_FP8_TRAIN)),                     # verl FP8 E2E: BF16 sync, rollout_is=token on
    ("K6", case(VE)),                                         # verl BF16 learner + FP8 rollout, rollout_is=token on
    ("K6", case(NE)),                                         # NeMo RL FP8 generation with its IS correction
])
def test_off_policy_by_construction_with_a_correction_is_a_warning_naming_the_mismatch(rule, cfg, tmp_path, capsys,
                                                                                      clean_env):
    """K5 and K6 judge one condition (a sampler off the learner's numerics by construction) alike: an error without
    the stack's importance-sampling correction (TABLE's failing cases), a warning with it that says what to expect."""
    monkeypatch = clean_env
    monkeypatch.setattr(jobconfig, "detect_gpu", lambda: None)
    argv = ["preflight", cfg["path"], "--gpu", cfg["gpu"], "--json"] + [a for x in cfg["sets"] for a in ("--set", x)]
    main(argv)
    lines = [ln for ln in json.loads(capsys.readouterr().out)["lines"] if ln["rule"] == rule]
    assert [ln["level"] for ln in lines] == ["warning"], lines
    assert "importance-sampling correction is on" in lines[0]["why"] and "gen_kl_error" in lines[0]["why"], lines


def test_table_covers_every_preflight_rule():
    """A new job or config rule without a passing and a failing config fails here."""
    rules = {i for i, inv in REGISTRY.items() if inv.family in PREFLIGHT_FAMILIES and inv.scope in ("job", "config")}
    assert rules - set(TABLE) == set(), "rules without a pass/fail config in TABLE"
    assert set(TABLE) - rules == set(), "TABLE names rules that are not registered pre-flight rules"


STACKS = ("SkyRL", "verl", "NeMo RL", "vLLM", "Transformer Engine", "Megatron")


def test_every_rule_cites_its_source():
    for i, inv in REGISTRY.items():
        assert inv.source.strip(), f"{i} has no source"
        own = inv.source.startswith("fp8check's own")
        assert own or any(s in inv.source for s in STACKS), f"{i}: source names no stack: {inv.source!r}"
        if not own:      # a mirrored rule names the file or the tracker thread it mirrors
            assert "/" in inv.source or "#" in inv.source, f"{i}: source names no file or thread"
        if inv.scope == "job" or inv.family in ("contract", "exclusion", "alignment"):
            assert inv.why.strip(), f"{i} has no why (what --explain prints)"


def test_catalog_lists_every_rule_with_its_source(capsys):
    assert main(["catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in rows} == set(REGISTRY)
    assert all(r["source"] == REGISTRY[r["id"]].source and r["source"] for r in rows)


@pytest.mark.parametrize("path,gpu,env", [(SK, "sm90", []), (SKB, "sm100", SKB_ENV), (VE, "sm90", []),
                                          (NE, "sm90", [])])
def test_examples_pass(path, gpu, env, tmp_path, capsys, clean_env):
    rc, levels = run_case(case(path, env=env, gpu=gpu), tmp_path, capsys, clean_env)
    assert rc == 0, {k: v for k, v in levels.items() if v == "error"}


def test_e3_claim_holds_for_the_quantizers_it_names():
    """E3 says a sender using scale_inv = amax/448 (SkyRL's wire, verl's Triton kernel: the formula fp8check's
    engines run for an engine-side quantization) can never give the trainer's bytes: the scales differ in many
    blocks and up to about one code in a thousand differs. Measured with the two quantizers the project mirrors: Transformer
    Engine's (`quantize_blockwise`, byte-exact to TE on the H200) and the senders' amax/448 one
    (`harness.numerics.online.amax_over_448_blockwise`), on
    four random BF16 weights (one of them happens to keep every code)."""
    import torch
    from fp8check.harness.formats import quantize_blockwise
    from fp8check.harness.numerics.online import amax_over_448_blockwise
    codes = scales = blocks = elems = 0
    for seed in range(4):
        w = (torch.randn(1024, 1024, generator=torch.Generator().manual_seed(seed)) * 0.02).bfloat16()
        q_te, s_te = quantize_blockwise(w, (128, 128))
        q_a, s_a = amax_over_448_blockwise(w)
        a, b = q_te.view(torch.uint8).int(), q_a.view(torch.uint8).int()
        codes += int((a != b).sum())
        scales += int((s_te != s_a).sum())
        elems, blocks = elems + w.numel(), blocks + s_te.numel()
        # every differing code is the neighbouring E4M3 value: one rounding apart, neither quantizer is broken
        assert int((a - b).abs().max()) <= 1
    assert 0 < codes < 1e-3 * elems, codes                  # never zero over the set, never a different scheme
    assert scales > 0.3 * blocks, (scales, blocks)


def test_yaml_round_trip_of_the_table_configs():
    """The table's --set values parse as the stacks' YAML would (a dict, a list, a quoted string)."""
    from fp8check.harness.cli import parse_sets
    got = parse_sets([VR + "engine_kwargs.vllm.hf_overrides={quantization_config: {quant_method: fp8}}",
                      NV + "quantization_ignored_layer_kws=[]", VENV + "VERL_DISABLE_TRITON_FP8='0'"])
    assert got[VR + "engine_kwargs.vllm.hf_overrides"] == {"quantization_config": {"quant_method": "fp8"}}
    assert got[NV + "quantization_ignored_layer_kws"] == [] and got[VENV + "VERL_DISABLE_TRITON_FP8"] == "0"
    assert yaml.safe_load("a: 1") == {"a": 1}
