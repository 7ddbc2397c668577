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
import json
import os
from dataclasses import dataclass, field, replace

from .config import ConfigError, PackingConfig, RolloutConfig, SyncConfig, TrainerConfig
from .formats import get_recipe
from .models import MODELS, ModelError, get_model, register_model, spec_from_hf_config

ENV_VARS = ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "NVTE_FP8_BLOCK_AMAX_EPSILON", "VLLM_USE_DEEP_GEMM",
            "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_MOE_USE_DEEP_GEMM")
SYNC_MODES = {None: None, "blockwise": "blockwise", "serialized_blockwise": "blockwise", "mxfp8": "mxfp8",
              "auto": "auto"}
FP8_FORMATS = (None, "e4m3", "hybrid")
RECIPE_NAMES = (None, "blockwise", "mxfp8", "auto")

_MC = "trainer.policy.megatron_config."
_REF = "trainer.ref.megatron_config."
_GEN = "generator.inference_engine."
_VA = "actor_rollout_ref.actor.megatron."
KNOWN = {
    # SkyRL trainer
    _MC + "fp8", _MC + "fp8_recipe", _MC + "fp8_param", _MC + "fp8_amax_compute_algo",
    _MC + "transformer_config_kwargs.fp8", _MC + "transformer_config_kwargs.fp8_recipe",
    _MC + "transformer_config_kwargs.fp8_param", _MC + "transformer_config_kwargs.fp8_amax_compute_algo",
    _MC + "transformer_config_kwargs.tp_only_amax_red", _MC + "ddp_config.fp8_param_gather",
    _MC + "tensor_model_parallel_size", _MC + "pipeline_model_parallel_size", _MC + "context_parallel_size",
    _MC + "expert_model_parallel_size", _MC + "expert_tensor_parallel_size", _MC + "lora_config.merge_lora",
    _REF + "fp8", _REF + "fp8_recipe", _REF + "fp8_param", _REF + "transformer_config_kwargs.fp8",
    _REF + "transformer_config_kwargs.fp8_recipe", _REF + "transformer_config_kwargs.fp8_param",
    "trainer.policy.model.path", "trainer.ref.model.path", "trainer.policy.model.lora.rank", "trainer.strategy",
    # SkyRL rollout
    _GEN + "fp8_weight_sync_mode", _GEN + "tensor_parallel_size", _GEN + "expert_parallel_size",
    _GEN + "pipeline_parallel_size", _GEN + "data_parallel_size", _GEN + "model_dtype",
    _GEN + "engine_init_kwargs.quantization", _GEN + "engine_init_kwargs.kv_cache_dtype",
    _GEN + "engine_init_kwargs.load_format",
    _GEN + "engine_init_kwargs.hf_overrides.quantization_config.weight_block_size",
    _GEN + "engine_init_kwargs.hf_overrides.quantization_config.ignored_layers",
    _GEN + "engine_init_kwargs.hf_overrides.quantization_config.quant_method",
    _GEN + "engine_init_kwargs.hf_overrides.quantization_config.activation_scheme",
    # verl
    _VA + "override_transformer_config.fp8", _VA + "override_transformer_config.fp8_recipe",
    _VA + "override_transformer_config.fp8_param", "actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe",
    _VA + "tensor_model_parallel_size", _VA + "context_parallel_size", _VA + "pipeline_model_parallel_size",
    _VA + "expert_model_parallel_size", "actor_rollout_ref.rollout.quantization",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.merge",
    # fp8check
    "fp8check.model", "fp8check.exclude", "fp8check.amax_epsilon", "fp8check.packing.collate_multiple",
    "fp8check.packing.preprocess_multiple", "fp8check.packing.replay_multiple", "fp8check.seed",
}
# prefixes whose every key fp8check must understand (a typo here silently changes numerics)
FP8_PREFIXES = (_MC + "fp8", _MC + "transformer_config_kwargs.fp8", _REF + "fp8", _GEN + "fp8",
                _GEN + "engine_init_kwargs.quantization", _GEN + "engine_init_kwargs.hf_overrides.quantization_config",
                _VA + "override_transformer_config.fp8", "actor_rollout_ref.rollout.quantization", "fp8check.")


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
    config: SyncConfig | None
    sources: dict = field(default_factory=dict)     # SyncConfig field -> (key or env var, value)
    lines: list = field(default_factory=list)
    fp8_training: bool = False
    fp8_rollout: bool = False
    model_known: bool = True


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


def parse_job(data: dict, env: dict, gpu: str = "auto", source: str = "config") -> Job:
    """Read a SkyRL / verl job config + environment into a Job (SyncConfig + provenance + parse-level lines)."""
    flat = flatten(data, source=source)
    job = Job(None)
    L = job.lines
    for k in flat:
        if k in KNOWN:
            continue
        if any(k.startswith(p) for p in FP8_PREFIXES):
            near = difflib.get_close_matches(k, sorted(KNOWN), n=1, cutoff=0.8)
            L.append(Line("error", "K1", k, flat[k], "unknown key under an FP8-relevant prefix (fp8check cannot tell "
                          "what it does to the numerics)", f"did you mean {near[0]}?" if near else
                          "remove it or report it to fp8check"))
    g = lambda k, kind, default=None: _typed(k, flat.get(k, default), kind, source)  # noqa: E731

    # -- trainer side: SkyRL (transformer_config_kwargs wins) or verl ------------------------------------------
    def trainer_key(name, kind):
        for k in (_MC + "transformer_config_kwargs." + name, _MC + name, _VA + "override_transformer_config." + name):
            if k in flat:
                return k, _typed(k, flat[k], kind, source)
        return None, None
    fmt_key, fp8_fmt = trainer_key("fp8", "str")
    rec_key, recipe_name = trainer_key("fp8_recipe", "str")
    par_key, fp8_param = trainer_key("fp8_param", "bool")
    if fp8_fmt not in FP8_FORMATS:
        raise ConfigError(f"{source}: {fmt_key} = {fp8_fmt!r}: expected one of e4m3, hybrid")
    if recipe_name not in RECIPE_NAMES:
        raise ConfigError(f"{source}: {rec_key} = {recipe_name!r}: unknown FP8 recipe; expected blockwise, mxfp8 "
                          f"or auto")
    job.fp8_training = fp8_fmt is not None
    arch, how = resolve_gpu(gpu)
    job.sources["gpu_arch"] = ("--gpu" if gpu != "auto" else "GPU", f"{arch} ({how})")
    major = int(arch[2:]) // 10
    if recipe_name in (None, "auto"):
        resolved = "mxfp8" if major >= 10 else "blockwise"
        job.sources["recipe"] = (rec_key or "fp8_recipe", f"{recipe_name or 'unset'} -> {resolved} on {arch}")
        recipe_name = resolved

    # -- rollout side --------------------------------------------------------------------------------------------
    mode_key = _GEN + "fp8_weight_sync_mode"
    mode = g(mode_key, "str")
    if mode not in SYNC_MODES:
        raise ConfigError(f"{source}: {mode_key} = {mode!r}: expected blockwise, mxfp8 or auto")
    if mode == "serialized_blockwise":
        L.append(Line("warning", "K2", mode_key, mode, "old name of the blockwise mode", "write blockwise"))
    mode = SYNC_MODES[mode]
    if mode == "auto":
        mode = recipe_name
    q_key = next((k for k in (_GEN + "engine_init_kwargs.quantization", "actor_rollout_ref.rollout.quantization")
                  if k in flat), None)
    rollout_quant = _typed(q_key, flat[q_key], "str", source) if q_key else None
    job.fp8_rollout = mode is not None or rollout_quant == "fp8"
    sync_mode = "onpolicy" if mode is not None else "naive"
    if mode is not None and mode != recipe_name:
        L.append(Line("error", "K3", mode_key, mode, f"the wire format ({mode}) is not the trainer's recipe "
                      f"({recipe_name}): the sampler runs another quantization than the learner",
                      f"set {mode_key}={recipe_name} (or auto)"))
    if mode is not None and rollout_quant not in (None, "fp8"):
        L.append(Line("error", "K4", q_key, rollout_quant, "serialized FP8 sync needs the engine started with "
                      "quantization=fp8", f"set {_GEN}engine_init_kwargs.quantization=fp8 (or leave it unset)"))
    if job.fp8_training and job.fp8_rollout and sync_mode == "naive":
        L.append(Line("error", "K5", q_key or mode_key, rollout_quant, "FP8 training with a BF16 weight sync: the "
                      "engine re-quantizes with its own scales and samples a policy the learner never held (S2)",
                      "sync the trainer's own FP8 codes and scales (SkyRL: generator.inference_engine.fp8_weight_sync_mode=blockwise)"))
    elif job.fp8_rollout and not job.fp8_training:
        L.append(Line("warning", "K6", q_key or mode_key, rollout_quant or mode, "FP8 rollout of a BF16 learner is "
                      "off-policy by construction", "use importance-sampling correction (TIS) or train in FP8"))

    # -- environment, resolved as each engine resolves it ------------------------------------------------------
    skyrl = any(k.startswith(("trainer.", "generator.")) for k in flat)
    # TE defaults to power-of-two block scales; SkyRL exports FP32 scales when FP8 is on (0 on Blackwell)
    te_default = ("0" if major >= 10 else "1") if skyrl and (job.fp8_training or mode) else "0"
    nvte, nvte_state = _env_flag(env, "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", te_default)
    trainer_scales = "fp32" if nvte == "1" else "pow2"
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
        job.sources["trainer.amax_epsilon"] = ("NVTE_FP8_BLOCK_AMAX_EPSILON", eps_env)
    eps_key = "fp8check.amax_epsilon"
    if eps_key in flat:
        v = flat[eps_key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{source}: {eps_key} must be a number, got {v!r}")
        recipe = replace(recipe, amax_epsilon=float(v))
        job.sources["recipe.amax_epsilon"] = (eps_key, v)
    dg, dg_state = _env_flag(env, "VLLM_USE_DEEP_GEMM", "1")
    # SkyRL pins E8M0 for its blockwise wire (0 for FP32 scales, 1 for power-of-two on Blackwell); vLLM: 1
    e8_default = ("0" if trainer_scales == "fp32" else "1") if skyrl and mode == "blockwise" else "1"
    e8, e8_state = _env_flag(env, "VLLM_USE_DEEP_GEMM_E8M0", e8_default)
    job.sources["rollout.use_deep_gemm"] = ("VLLM_USE_DEEP_GEMM", f"{dg} ({dg_state}; vLLM default 1)")
    job.sources["rollout.deep_gemm_e8m0"] = ("VLLM_USE_DEEP_GEMM_E8M0", f"{e8} ({e8_state}; "
                                             f"{'SkyRL' if skyrl and mode == 'blockwise' else 'vLLM'} default {e8_default})")
    moe_dg = env.get("VLLM_MOE_USE_DEEP_GEMM")

    # -- sizes, LoRA, model ------------------------------------------------------------------------------------
    def first(kind, *keys, default=None):
        for k in keys:
            if k in flat:
                return _typed(k, flat[k], kind, source), k
        return default, keys[0]
    ttp, ttp_key = first("int", _MC + "tensor_model_parallel_size", _VA + "tensor_model_parallel_size", default=1)
    tcp, _ = first("int", _MC + "context_parallel_size", _VA + "context_parallel_size", default=1)
    rtp, rtp_key = first("int", _GEN + "tensor_parallel_size", "actor_rollout_ref.rollout.tensor_model_parallel_size",
                         default=1)
    job.sources["trainer.tp_size"] = (ttp_key, ttp)
    job.sources["rollout.tp_size"] = (rtp_key, rtp)
    lora, lora_key = first("int", "trainer.policy.model.lora.rank", "actor_rollout_ref.model.lora_rank", default=0)
    merge, _ = first("bool", _MC + "lora_config.merge_lora", "actor_rollout_ref.model.lora.merge",
                     default=(not lora_key.startswith("actor_rollout_ref")))
    job.sources["lora"] = (lora_key, f"rank {lora}, merge {merge}")
    if job.sources.get("trainer.fp8_param") is None and par_key:
        job.sources["trainer.fp8_param"] = (par_key, fp8_param)
    if fp8_param and not flat.get(_MC + "ddp_config.fp8_param_gather", False) and par_key and par_key.startswith(_MC):
        L.append(Line("error", "K7", _MC + "ddp_config.fp8_param_gather", flat.get(_MC + "ddp_config.fp8_param_gather"),
                      "persistent FP8 parameters need the FP8 all-gather", f"set {_MC}ddp_config.fp8_param_gather=true"))
    strategy = flat.get("trainer.strategy")
    if mode is not None and skyrl and strategy not in (None, "megatron"):
        L.append(Line("error", "K8", "trainer.strategy", strategy, "serialized FP8 weight sync needs the Megatron "
                      "trainer (the FP8 forward weights come from Transformer Engine)", "set trainer.strategy=megatron"))
    for name in ("fp8", "fp8_recipe", "fp8_param"):      # the reference policy must run the learner's numerics
        for k in (_REF + "transformer_config_kwargs." + name, _REF + name):
            if k in flat:
                mine = {"fp8": fp8_fmt, "fp8_recipe": recipe_name if flat[k] != "auto" else flat[k],
                        "fp8_param": fp8_param}[name]
                if flat[k] != mine and not (name == "fp8_recipe" and flat[k] in ("auto", recipe_name)):
                    L.append(Line("warning", "K9", k, flat[k], f"the reference model's {name} differs from the "
                                  f"policy's ({mine}): KL terms compare different numerics", f"set it to {mine}"))
                break
    kv = flat.get(_GEN + "engine_init_kwargs.kv_cache_dtype")

    model_key = next((k for k in ("fp8check.model", "trainer.policy.model.path", "actor_rollout_ref.model.path")
                      if k in flat), None)
    model_name = flat.get(model_key) if model_key else "tiny-dense"
    if not isinstance(model_name, str):
        raise ConfigError(f"{source}: {model_key} must be a string, got {model_name!r}")
    if model_name not in MODELS:
        cfg_path = os.path.join(model_name, "config.json") if os.path.isdir(model_name) else model_name
        if os.path.isfile(cfg_path) and cfg_path.endswith(".json"):
            try:
                with open(cfg_path) as f:
                    hf = json.load(f)
                register_model(spec_from_hf_config(hf, model_name))
            except (ValueError, ModelError) as e:
                raise ConfigError(f"{cfg_path}: cannot read the model's dims ({e})") from None
        else:
            job.model_known = False
            L.append(Line("warning", "M1", model_key, model_name, "model dims unknown here (not a tiny model name nor a "
                          "local path with config.json): shape, alignment and exclusion rules use tiny-dense",
                          "point the model path at a local checkpoint directory to check its dims"))
            model_name = "tiny-dense"
    if kv and "fp8" in str(kv) and any(t != "full_attention" for t in get_model(model_name).layer_types):
        L.append(Line("warning", "M2", _GEN + "engine_init_kwargs.kv_cache_dtype", kv, "FP8 KV cache with linear-"
                      "attention layers is not supported by the FP8 sync path yet", "leave kv_cache_dtype=auto"))

    exclude = flat.get("fp8check.exclude") or []
    if not isinstance(exclude, list):
        raise ConfigError(f"{source}: fp8check.exclude must be a list of module-name patterns")
    bs = flat.get(_GEN + "engine_init_kwargs.hf_overrides.quantization_config.weight_block_size")
    pk = {k.rsplit(".", 1)[1]: flat[k] for k in flat if k.startswith("fp8check.packing.")}
    try:
        cfg = SyncConfig(
            model=model_name, recipe=recipe, sync_mode=sync_mode, exclude=tuple(str(x) for x in exclude),
            trainer=TrainerConfig(tp_size=ttp, cp_size=tcp, fp8_param=bool(fp8_param), scale_format=trainer_scales
                                  if recipe.granularity == "block" else None, amax_epsilon=trainer_eps),
            rollout=RolloutConfig(tp_size=rtp, use_deep_gemm=dg == "1", deep_gemm_e8m0=e8 == "1",
                                  moe_backend="deep_gemm" if moe_dg == "1" else "triton",
                                  weight_block_size=tuple(bs) if isinstance(bs, list) else None),
            packing=PackingConfig(**pk), gpu_arch=arch, lora_rank=lora, lora_merge=bool(merge),
            seed=int(flat.get("fp8check.seed", 0)))
    except TypeError as e:
        raise ConfigError(f"{source}: {e}") from None
    job.config = cfg
    ign = flat.get(_GEN + "engine_init_kwargs.hf_overrides.quantization_config.ignored_layers")
    if ign is not None:
        want = set(cfg.ignored_layers)
        got = set(ign) if isinstance(ign, list) else None
        if got is None:
            raise ConfigError(f"{source}: ignored_layers must be a list of module names")
        if got != want:
            L.append(Line("error", "X6", _GEN + "engine_init_kwargs.hf_overrides.quantization_config.ignored_layers",
                          sorted(got ^ want)[:6], "the engine's ignored_layers differ from the trainer's high-precision "
                          f"set (missing {sorted(want - got)[:3]}, extra {sorted(got - want)[:3]})",
                          "derive ignored_layers from the same exclusion set (remove the override)"))
    return job
