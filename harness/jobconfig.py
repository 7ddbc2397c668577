"""An RL job's FP8 configuration in its own language (SkyRL or verl keys, nested or dotted) plus the process
environment, resolved the way each engine resolves it, into the one SyncConfig the checks read -- with the
provenance of every value, so a failed rule can name the key or variable to change.

SkyRL (skyrl/train/config/config.py, FP8 sync PR #1898): trainer.{policy,ref}.megatron_config.{fp8, fp8_recipe,
fp8_param} (or the same under transformer_config_kwargs, which win), ddp_config.fp8_param_gather, parallel sizes,
lora; generator.inference_engine.{fp8_weight_sync_mode, tensor_parallel_size, engine_init_kwargs.*}.
verl: actor_rollout_ref.actor.megatron.override_transformer_config.{fp8, fp8_recipe, fp8_param},
actor_rollout_ref.rollout.{quantization, tensor_model_parallel_size}, actor_rollout_ref.model.{path, lora_rank}.
fp8check's own keys (exclude, packing, amax_epsilon, model) go under `fp8check.`.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, replace

from .config import ConfigError, PackingConfig, RolloutConfig, SyncConfig, TrainerConfig
from .formats import arch_major, get_recipe, recipe_for_arch
from .models import MODELS, SHIPPED, ModelError, get_model

ENV_VARS = ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "NVTE_FP8_BLOCK_AMAX_EPSILON", "VLLM_USE_DEEP_GEMM",
            "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_MOE_USE_DEEP_GEMM")
SYNC_MODES = {None: None, "blockwise": "blockwise", "serialized_blockwise": "blockwise", "mxfp8": "mxfp8",
              "auto": "auto"}
FP8_FORMATS = (None, "e4m3", "hybrid")
RECIPE_NAMES = (None, "blockwise", "mxfp8", "auto")

SKYRL_MEGATRON = "trainer.policy.megatron_config."
SKYRL_REF_MEGATRON = "trainer.ref.megatron_config."
SKYRL_ENGINE = "generator.inference_engine."
VERL_MEGATRON = "actor_rollout_ref.actor.megatron."
KNOWN = {
    # SkyRL trainer
    SKYRL_MEGATRON + "fp8", SKYRL_MEGATRON + "fp8_recipe", SKYRL_MEGATRON + "fp8_param", SKYRL_MEGATRON + "fp8_amax_compute_algo",
    SKYRL_MEGATRON + "transformer_config_kwargs.fp8", SKYRL_MEGATRON + "transformer_config_kwargs.fp8_recipe",
    SKYRL_MEGATRON + "transformer_config_kwargs.fp8_param", SKYRL_MEGATRON + "transformer_config_kwargs.fp8_amax_compute_algo",
    SKYRL_MEGATRON + "transformer_config_kwargs.tp_only_amax_red", SKYRL_MEGATRON + "ddp_config.fp8_param_gather",
    SKYRL_MEGATRON + "tensor_model_parallel_size", SKYRL_MEGATRON + "pipeline_model_parallel_size", SKYRL_MEGATRON + "context_parallel_size",
    SKYRL_MEGATRON + "expert_model_parallel_size", SKYRL_MEGATRON + "expert_tensor_parallel_size", SKYRL_MEGATRON + "lora_config.merge_lora",
    SKYRL_REF_MEGATRON + "fp8", SKYRL_REF_MEGATRON + "fp8_recipe", SKYRL_REF_MEGATRON + "fp8_param", SKYRL_REF_MEGATRON + "transformer_config_kwargs.fp8",
    SKYRL_REF_MEGATRON + "transformer_config_kwargs.fp8_recipe", SKYRL_REF_MEGATRON + "transformer_config_kwargs.fp8_param",
    "trainer.policy.model.path", "trainer.ref.model.path", "trainer.policy.model.lora.rank", "trainer.strategy",
    # SkyRL rollout
    SKYRL_ENGINE + "fp8_weight_sync_mode", SKYRL_ENGINE + "tensor_parallel_size", SKYRL_ENGINE + "expert_parallel_size",
    SKYRL_ENGINE + "pipeline_parallel_size", SKYRL_ENGINE + "data_parallel_size", SKYRL_ENGINE + "model_dtype",
    SKYRL_ENGINE + "engine_init_kwargs.quantization", SKYRL_ENGINE + "engine_init_kwargs.kv_cache_dtype",
    SKYRL_ENGINE + "engine_init_kwargs.load_format",
    SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.weight_block_size",
    SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.ignored_layers",
    SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.quant_method",
    SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.activation_scheme",
    # verl
    VERL_MEGATRON + "override_transformer_config.fp8", VERL_MEGATRON + "override_transformer_config.fp8_recipe",
    VERL_MEGATRON + "override_transformer_config.fp8_param", "actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe",
    VERL_MEGATRON + "tensor_model_parallel_size", VERL_MEGATRON + "context_parallel_size", VERL_MEGATRON + "pipeline_model_parallel_size",
    VERL_MEGATRON + "expert_model_parallel_size", "actor_rollout_ref.rollout.quantization",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.merge",
    # fp8check
    "fp8check.model", "fp8check.exclude", "fp8check.amax_epsilon", "fp8check.packing.collate_multiple",
    "fp8check.packing.preprocess_multiple", "fp8check.packing.replay_multiple", "fp8check.seed",
}
# prefixes whose every key fp8check must understand (a typo here silently changes numerics)
FP8_PREFIXES = (SKYRL_MEGATRON + "fp8", SKYRL_MEGATRON + "transformer_config_kwargs.fp8", SKYRL_REF_MEGATRON + "fp8", SKYRL_ENGINE + "fp8",
                SKYRL_ENGINE + "engine_init_kwargs.quantization", SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config",
                VERL_MEGATRON + "override_transformer_config.fp8", "actor_rollout_ref.rollout.quantization", "fp8check.")


@dataclass
class Line:
    """One pre-flight verdict line."""
    level: str                 # ok | error | warning
    rule: str
    key: str
    value: object
    why: str
    fix: str = ""

    def to_json(self) -> dict:
        return {"level": self.level, "rule": self.rule, "key": self.key, "value": self.value, "why": self.why,
                "fix": self.fix}


@dataclass
class Job:
    """An RL job's FP8 configuration as read: the SyncConfig it resolves to, where every value came from, and
    the facts the job rules (invariants/job.py) judge, each under the key the user wrote."""
    config: SyncConfig | None
    source: str = "config"
    flat: dict = field(default_factory=dict)        # every key as written, dotted
    sources: dict = field(default_factory=dict)     # SyncConfig field -> (key or env var, value)
    stack: str = "fp8check"                         # skyrl | verl | nemo-rl | fp8check: whose keys these are
    fp8_training: bool = False
    fp8_rollout: bool = False
    fp8_format: str | None = None
    fp8_format_key: str | None = None
    recipe_name: str = "blockwise"                  # the trainer's recipe, `auto` resolved
    recipe_key: str | None = None
    fp8_param: bool | None = None
    fp8_param_key: str | None = None
    wire_mode: str | None = None                    # the FP8 wire format (blockwise | mxfp8), `auto` resolved
    wire_mode_written: str | None = None
    wire_mode_key: str = "generator.inference_engine.fp8_weight_sync_mode"
    rollout_quant: str | None = None
    rollout_quant_key: str | None = None
    strategy: str | None = None
    kv_cache_dtype: str | None = None
    kv_cache_key: str | None = None
    model_key: str | None = None
    model_written: object = None
    model_known: bool = True
    ignored_layers: list | None = None              # an explicit engine ignored_layers override
    ignored_layers_key: str | None = None
    env: dict = field(default_factory=dict)


def flatten(data, prefix: str = "", source: str = "config") -> dict:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of keys, got {type(data).__name__}")
    out = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise ConfigError(f"{source}: key {k!r} is not a string")
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + ".", source))
        else:
            out[key] = v
    return out


def _typed(key: str, v, kind, source: str):
    ok = {"bool": lambda x: isinstance(x, bool), "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
          "str": lambda x: isinstance(x, str), "list": lambda x: isinstance(x, list)}[kind]
    if v is not None and not ok(v):
        raise ConfigError(f"{source}: {key} must be {kind}, got {v!r}")
    return v


def resolve_gpu(gpu: str) -> tuple[str, str]:
    """(arch, how it was decided)."""
    if gpu != "auto":
        if gpu not in ("sm90", "sm100", "sm120"):
            raise ConfigError(f"--gpu {gpu}: expected sm90, sm100, sm120 or auto")
        return gpu, "--gpu"
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}", f"detected {torch.cuda.get_device_name()}"
    except Exception:  # noqa: BLE001 - no usable torch.cuda: fall through
        pass
    return "sm90", "no GPU visible: assumed Hopper (pass --gpu sm100 for Blackwell)"


def _env_flag(env: dict, name: str, default: str) -> tuple[str, str]:
    v = env.get(name)
    if v is None or v == "":
        return default, "unset"
    if v not in ("0", "1"):
        raise ConfigError(f"environment: {name}={v!r} must be 0 or 1")
    return v, "set"


def _int(flat: dict, key: str, source: str, minimum: int | None = None):
    v = flat.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{source}: {key} must be an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise ConfigError(f"{source}: {key} must be >= {minimum}, got {v}")
    return v


def _stack(flat: dict) -> str:
    if any(k.startswith(("trainer.", "generator.")) for k in flat):
        return "skyrl"
    if any(k.startswith("actor_rollout_ref.") for k in flat):
        return "verl"
    if any(k.startswith("policy.") for k in flat):
        return "nemo-rl"
    return "fp8check"


def _model(flat: dict, source: str, job: Job) -> str:
    """The model the job trains: a model name (harness.models.get_model: built-in, shipped, NAME@<N>L), a hub id
    of a shipped config, or a local checkpoint / config.json (registered); anything else is unknown here."""
    key = next((k for k in ("fp8check.model", "trainer.policy.model.path", "actor_rollout_ref.model.path",
                            "policy.model_name") if k in flat), None)
    job.model_key = key
    name = flat.get(key) if key else "tiny-dense"
    job.model_written = name
    if not isinstance(name, str):
        raise ConfigError(f"{source}: {key} must be a string, got {name!r}")
    hub = name.rsplit("/", 1)[-1].lower()
    if not os.path.exists(name) and name not in MODELS and hub in SHIPPED:
        name = hub                           # a hub id of a shipped config (Qwen/Qwen3-8B): its public shapes
    if name in MODELS or name in SHIPPED or "@" in name or os.path.exists(name):
        try:
            return get_model(name).name      # a model name, a shipped config, a cut, a config.json / checkpoint
        except ModelError as e:
            raise ConfigError(f"{key or 'model'}: {e}") from None
    job.model_known = False
    return "tiny-dense"


def parse_job(data: dict, env: dict, gpu: str = "auto", source: str = "config") -> Job:
    """Read a SkyRL / verl job config + environment into a Job: the SyncConfig, the provenance of every value
    and the facts the job rules judge. Type errors are ConfigError naming the key as the user wrote it."""
    flat = flatten(data, source=source)
    job = Job(None, source, flat, stack=_stack(flat))
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k:
            raise ConfigError(f"environment: {k!r} is not a variable name")
    g = lambda k, kind, default=None: _typed(k, flat.get(k, default), kind, source)  # noqa: E731

    # -- trainer side: SkyRL (transformer_config_kwargs wins) or verl ------------------------------------------
    def trainer_key(name, kind):
        for k in (SKYRL_MEGATRON + "transformer_config_kwargs." + name, SKYRL_MEGATRON + name, VERL_MEGATRON + "override_transformer_config." + name):
            if k in flat:
                return k, _typed(k, flat[k], kind, source)
        return None, None
    job.fp8_format_key, job.fp8_format = trainer_key("fp8", "str")
    job.recipe_key, recipe_name = trainer_key("fp8_recipe", "str")
    job.fp8_param_key, job.fp8_param = trainer_key("fp8_param", "bool")
    if job.fp8_format not in FP8_FORMATS:
        raise ConfigError(f"{source}: {job.fp8_format_key} = {job.fp8_format!r}: expected one of e4m3, hybrid")
    if recipe_name not in RECIPE_NAMES:
        raise ConfigError(f"{source}: {job.recipe_key} = {recipe_name!r}: unknown FP8 recipe; expected blockwise, "
                          f"mxfp8 or auto")
    job.fp8_training = job.fp8_format is not None
    arch, how = resolve_gpu(gpu)
    job.sources["gpu_arch"] = ("--gpu" if gpu != "auto" else "GPU", f"{arch} ({how})")
    major = arch_major(arch) or 9
    if recipe_name in (None, "auto"):
        resolved = recipe_for_arch(arch)
        job.sources["recipe"] = (job.recipe_key or "fp8_recipe", f"{recipe_name or 'unset'} -> {resolved} on {arch}")
        recipe_name = resolved
    job.recipe_name = recipe_name

    # -- rollout side --------------------------------------------------------------------------------------------
    mode = g(job.wire_mode_key, "str")
    if mode not in SYNC_MODES:
        raise ConfigError(f"{source}: {job.wire_mode_key} = {mode!r}: expected blockwise, mxfp8 or auto")
    job.wire_mode_written = mode
    mode = SYNC_MODES[mode]
    if mode == "auto":
        mode = recipe_name
    job.wire_mode = mode
    job.rollout_quant_key = next((k for k in (SKYRL_ENGINE + "engine_init_kwargs.quantization",
                                              "actor_rollout_ref.rollout.quantization") if k in flat), None)
    job.rollout_quant = _typed(job.rollout_quant_key, flat[job.rollout_quant_key], "str", source) \
        if job.rollout_quant_key else None
    job.fp8_rollout = mode is not None or job.rollout_quant == "fp8"
    sync_mode = "onpolicy" if mode is not None else "naive"

    # -- environment, resolved as each engine resolves it ------------------------------------------------------
    skyrl = job.stack == "skyrl"
    # TE defaults to power-of-two block scales; SkyRL exports FP32 scales when FP8 is on (0 on Blackwell)
    te_default = ("0" if major >= 10 else "1") if skyrl and (job.fp8_training or mode) else "0"
    nvte, nvte_state = _env_flag(env, "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", te_default)
    trainer_scales = "fp32" if nvte == "1" else "pow2"
    job.env["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] = (nvte, nvte_state, te_default)
    job.sources["trainer.scale_format"] = ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
                                           f"{nvte} ({nvte_state}; {'SkyRL' if skyrl else 'Transformer Engine'} "
                                           f"default {te_default})")
    recipe = get_recipe("mxfp8" if recipe_name == "mxfp8" else ("blockwise-fp32" if trainer_scales == "fp32"
                                                                else "blockwise-pow2"))
    eps_env = env.get("NVTE_FP8_BLOCK_AMAX_EPSILON")
    trainer_eps = None
    if eps_env not in (None, ""):
        try:
            trainer_eps = float(eps_env)
        except ValueError:
            raise ConfigError(f"environment: NVTE_FP8_BLOCK_AMAX_EPSILON={eps_env!r} is not a number") from None
        if not trainer_eps >= 0:
            raise ConfigError(f"environment: NVTE_FP8_BLOCK_AMAX_EPSILON={eps_env!r} must be a number >= 0")
        job.sources["trainer.amax_epsilon"] = ("NVTE_FP8_BLOCK_AMAX_EPSILON", eps_env)
    eps_key = "fp8check.amax_epsilon"
    if eps_key in flat:
        v = flat[eps_key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ConfigError(f"{source}: {eps_key} must be a number >= 0, got {v!r}")
        recipe = replace(recipe, amax_epsilon=float(v))
        job.sources["recipe.amax_epsilon"] = (eps_key, v)
    dg, dg_state = _env_flag(env, "VLLM_USE_DEEP_GEMM", "1")
    # SkyRL pins E8M0 for its blockwise wire (0 for FP32 scales, 1 for power-of-two on Blackwell); vLLM: 1
    e8_default = ("0" if trainer_scales == "fp32" else "1") if skyrl and mode == "blockwise" else "1"
    e8, e8_state = _env_flag(env, "VLLM_USE_DEEP_GEMM_E8M0", e8_default)
    job.env["VLLM_USE_DEEP_GEMM"] = (dg, dg_state, "1")
    job.env["VLLM_USE_DEEP_GEMM_E8M0"] = (e8, e8_state, e8_default)
    job.sources["rollout.use_deep_gemm"] = ("VLLM_USE_DEEP_GEMM", f"{dg} ({dg_state}; vLLM default 1)")
    job.sources["rollout.deep_gemm_e8m0"] = ("VLLM_USE_DEEP_GEMM_E8M0", f"{e8} ({e8_state}; "
                                             f"{'SkyRL' if skyrl and mode == 'blockwise' else 'vLLM'} default {e8_default})")
    moe_dg = env.get("VLLM_MOE_USE_DEEP_GEMM")
    if moe_dg not in (None, "", "0", "1"):
        raise ConfigError(f"environment: VLLM_MOE_USE_DEEP_GEMM={moe_dg!r} must be 0 or 1")

    # -- sizes, LoRA, model ------------------------------------------------------------------------------------
    def first(kind, *keys, default=None, minimum=None):
        for k in keys:
            if k in flat:
                v = _int(flat, k, source, minimum) if kind == "int" else _typed(k, flat[k], kind, source)
                return (default if v is None else v), k
        return default, keys[0]
    ttp, ttp_key = first("int", SKYRL_MEGATRON + "tensor_model_parallel_size", VERL_MEGATRON + "tensor_model_parallel_size", default=1,
                         minimum=1)
    tcp, _ = first("int", SKYRL_MEGATRON + "context_parallel_size", VERL_MEGATRON + "context_parallel_size", default=1, minimum=1)
    rtp, rtp_key = first("int", SKYRL_ENGINE + "tensor_parallel_size", "actor_rollout_ref.rollout.tensor_model_parallel_size",
                         default=1, minimum=1)
    job.sources["trainer.tp_size"] = (ttp_key, ttp)
    job.sources["rollout.tp_size"] = (rtp_key, rtp)
    lora, lora_key = first("int", "trainer.policy.model.lora.rank", "actor_rollout_ref.model.lora_rank", default=0,
                           minimum=0)
    merge, _ = first("bool", SKYRL_MEGATRON + "lora_config.merge_lora", "actor_rollout_ref.model.lora.merge",
                     default=(not lora_key.startswith("actor_rollout_ref")))
    job.sources["lora"] = (lora_key, f"rank {lora}, merge {merge}")
    if job.fp8_param_key:
        job.sources["trainer.fp8_param"] = (job.fp8_param_key, job.fp8_param)
    job.strategy = flat.get("trainer.strategy")
    job.kv_cache_key = SKYRL_ENGINE + "engine_init_kwargs.kv_cache_dtype" if SKYRL_ENGINE + "engine_init_kwargs.kv_cache_dtype" in flat \
        else None
    job.kv_cache_dtype = flat.get(job.kv_cache_key) if job.kv_cache_key else None
    model_name = _model(flat, source, job)

    exclude = flat.get("fp8check.exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise ConfigError(f"{source}: fp8check.exclude must be a list of module-name patterns")
    bs_key = SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.weight_block_size"
    bs = flat.get(bs_key)
    if bs is not None and (not isinstance(bs, list) or len(bs) != 2 or
                           not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in bs)):
        raise ConfigError(f"{source}: {bs_key} must be two positive integers like [128, 128], got {bs!r}")
    pk = {}
    for k in flat:
        if k.startswith("fp8check.packing."):
            pk[k.rsplit(".", 1)[1]] = _int(flat, k, source, minimum=1)
    seed = _int(flat, "fp8check.seed", source, minimum=0) or 0
    try:
        cfg = SyncConfig(
            model=model_name, recipe=recipe, sync_mode=sync_mode, exclude=tuple(exclude),
            trainer=TrainerConfig(tp_size=ttp, cp_size=tcp, fp8_param=bool(job.fp8_param),
                                  scale_format=trainer_scales if recipe.granularity == "block" else None,
                                  amax_epsilon=trainer_eps),
            rollout=RolloutConfig(tp_size=rtp, use_deep_gemm=dg == "1", deep_gemm_e8m0=e8 == "1",
                                  moe_backend="deep_gemm" if moe_dg == "1" else "triton",
                                  weight_block_size=tuple(bs) if bs is not None else None),
            packing=PackingConfig(**pk), gpu_arch=arch, lora_rank=lora, lora_merge=bool(merge), seed=seed)
    except (TypeError, ModelError) as e:
        raise ConfigError(f"{source}: {e}") from None
    job.config = cfg
    ik = SKYRL_ENGINE + "engine_init_kwargs.hf_overrides.quantization_config.ignored_layers"
    if ik in flat:
        ign = flat[ik]
        if not isinstance(ign, list) or not all(isinstance(x, str) for x in ign):
            raise ConfigError(f"{source}: {ik} must be a list of module names")
        job.ignored_layers, job.ignored_layers_key = ign, ik
    return job
