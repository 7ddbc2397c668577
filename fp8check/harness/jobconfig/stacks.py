"""Per-stack readers: the job's keys (as SkyRL, verl or NeMo RL resolve them, defaults and forcing included) ->
the typed facts the job rules judge, each a Fact carrying the key as written and where its value came from.

The resolution each reader applies is the stack's own, with the file it mirrors:
SkyRL 0.4.0 (the PyPI wheel; harness/jobconfig/versions.py): transformer_config_kwargs win over the top-level
aliases (train/config/config.py:627-644, setdefault); `fp8_recipe: auto` -> mxfp8 on sm100+, else blockwise, and a
GPU-less driver leaves it `auto` (distributed/megatron/quantization_utils.py:53-86); `fp8_weight_sync_mode: auto`
follows the policy recipe (:167-191); NVTE_FP8_BLOCK_SCALING_FP32_SCALES defaults on the *driver* to 0 on sm100+
else 1, a GPU-less driver refuses to guess it, and VLLM_USE_DEEP_GEMM_E8M0 is pinned for the blockwise wire
(train/utils/utils.py:1094-1146); the engine is started with quantization / load_format=dummy /
quantization_config forced (inference_servers/utils.py:67-120).
verl (1dda039b): rollout.quantization=fp8 -> a 128x128 block config with `model.layers.N.mlp.gate` ignored for every
layer, BF16 sent and re-quantized in the rollout worker (vllm_async_server.py:1065-1096, vllm_quant_utils.py); no
variable is set or pinned by verl.
NeMo RL (7ea279ab): vllm_cfg.precision=fp8 -> FP8 generation, blockwise or ModelOpt MXFP8 (is_mx): a block-FP8
checkpoint engine whose load_weights re-quantizes the BF16 refit tensor by tensor (quantization/fp8.py:190-310,
476-620: rollout.quantization=nemo-rl-blockwise, harness.numerics.nemo_rl); `use_deep_gemm: true` (non-MX) sets
VLLM_USE_DEEP_GEMM=1 and VLLM_USE_DEEP_GEMM_E8M0=0 in the vLLM worker (fp8.py:240-242); megatron_cfg.env_vars and
vllm_cfg.env_vars reach their workers over the driver's environment (distributed/worker_groups.py:452-455,
generation/vllm/vllm_generation.py:213-218).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError
from ..patterns import matches
from ..errors import did_you_mean
from .keys import (NEMO_DDP, NEMO_FP8, NEMO_MEGATRON, NEMO_VLLM, SKYRL_EIK, SKYRL_ENGINE, SKYRL_MEGATRON,
                   SKYRL_REF_MEGATRON, SKYRL_REF_TCK, SKYRL_TCK, VERL_MEGATRON, VERL_ROLLOUT,
                   VERL_RUNTIME_ENV, VERL_TC, VERL_VLLM_KWARGS)

# SkyRL quantization_utils.is_fp8_enabled: these strings switch FP8 off
FP8_OFF = ("", "0", "false", "none", "null", "no", "off")
FP8_FORMATS = ("e4m3", "hybrid")
# Megatron-Core TransformerConfig.fp8_recipe (transformer_config.py:573) plus SkyRL's `auto`
MEGATRON_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
CHECKED_RECIPES = ("blockwise", "mxfp8")
SKYRL_WIRES = ("blockwise", "mxfp8")
SKYRL_ENGINE_QUANT = {"blockwise": "fp8", "mxfp8": "compressed-tensors"}   # quantization_utils.py:194-209


@dataclass(frozen=True)
class Fact:
    """One value a rule reads: the value, the key (or variable, or flag) the user writes to change it, and where
    the value came from (written, inherited, a stack's default, forced by the stack, derived)."""
    value: object
    key: str | None = None
    origin: str = ""


def fp8_format(key: str, v, source: str):
    """Megatron's fp8: a format name (e4m3 | hybrid) or off; anything else Megatron-Core refuses
    (fp8_utils.py get_fp8_recipe: "E4M3 and HYBRID are the only supported FP8 formats")."""
    if v is None or v is False or (isinstance(v, str) and v.strip().lower() in FP8_OFF):
        return None
    if isinstance(v, str) and v.strip().lower() in FP8_FORMATS:
        return v.strip().lower()
    raise ConfigError(f"{source}: {key} = {v!r}: expected e4m3 or hybrid (Megatron-Core accepts only these FP8 "
                      f"formats), or null / off")


def recipe_name(key: str, v, source: str):
    if v is None:
        return None
    s = str(v).strip().lower()
    if s not in MEGATRON_RECIPES + ("auto",):
        raise ConfigError(f"{source}: {key} = {v!r}: unknown FP8 recipe{did_you_mean(s, MEGATRON_RECIPES + ('auto',))} "
                          f"(expected blockwise, mxfp8 or auto; Megatron-Core also knows "
                          f"{', '.join(r for r in MEGATRON_RECIPES if r not in CHECKED_RECIPES)})")
    return s


class Reader:
    """Shared plumbing: typed access to the job's keys with their provenance, and fact recording."""

    def __init__(self, job, env: dict, env_origin: dict):
        self.job, self.env, self.env_origin = job, env, env_origin

    def val(self, key, default=None):
        return self.job.flat.get(key, default)

    def fact(self, name, value, key=None, origin=None):
        if origin is None:
            origin = self.job.origin.get(key, "not written") if key else "derived"
        self.job.facts[name] = Fact(value, key, origin)
        return value

    def first(self, *keys):
        """(key, value) of the first key the job has, else (keys[0], None)."""
        for k in keys:
            if k in self.job.flat:
                return k, self.job.flat[k]
        return keys[0], None

    def env_fact(self, name: str, process: str, var: str, default: str | None, default_origin: str,
                 config_key: str | None = None, forced: tuple | None = None):
        """A variable as one process group sees it: forced by the stack > the job's env map > the driver's
        environment > the default. Validates 0/1 flags."""
        src = self.job.source
        if forced is not None:
            value, key, origin = forced
        elif config_key and config_key in self.job.flat and self.job.flat[config_key] is not None:
            value, key, origin = str(self.job.flat[config_key]), config_key, self.job.origin.get(config_key, "written")
        elif self.env.get(var) not in (None, ""):
            value, key, origin = self.env[var], var, self.env_origin.get(var, "environment")
        else:
            value, key, origin = default, var, default_origin
        if value is not None and var != "NVTE_FP8_BLOCK_AMAX_EPSILON" and value not in ("0", "1"):
            where = key if key != var else f"environment: {var}"
            raise ConfigError(f"{src if key != var else 'environment'}: {where}={value!r} must be 0 or 1")
        return self.fact(f"env.{process}.{var}", value, key, origin)


def arch_major(arch: str) -> int:
    try:
        return int(str(arch).removeprefix("sm")) // 10
    except ValueError:
        return 9


# -- the trainer ----------------------------------------------------------------------------------------------------
def read_trainer(r: Reader, stack: str):
    """fp8 / fp8_recipe / fp8_param of the policy trainer, as the stack resolves them."""
    j, src = r.job, r.job.source
    if stack == "skyrl":
        keys = {n: (SKYRL_TCK + n, SKYRL_MEGATRON + n) for n in ("fp8", "fp8_recipe", "fp8_param")}
    elif stack == "verl":
        keys = {n: (VERL_TC + n,) for n in ("fp8", "fp8_recipe", "fp8_param")}
    elif stack == "nemo-rl":
        keys = {n: (NEMO_FP8 + n,) for n in ("fp8", "fp8_recipe", "fp8_param")}
    else:
        keys = {}
    if not keys:
        r.fact("fp8_training", False, None, "fp8check keys only: no trainer FP8 settings")
        r.fact("fp8_format", None)
        r.fact("recipe_written", None)
        r.fact("fp8_param", None)
        return
    fk, fv = r.first(*keys["fp8"])
    fmt = fp8_format(fk, fv, src)
    if stack == "nemo-rl":
        # fp8_cfg is read by the Megatron backend only, and only with enabled: true (megatron/setup.py:1171-1178)
        en_key = NEMO_FP8 + "enabled"
        on = bool(r.val(en_key)) and bool(r.val(NEMO_MEGATRON + "enabled"))
        r.fact("fp8_training", on and fmt is not None, en_key)
        r.fact("fp8_format", fmt if on else None, fk)
    else:
        r.fact("fp8_training", fmt is not None, fk)
        r.fact("fp8_format", fmt, fk)
    rk, rv = r.first(*keys["fp8_recipe"])
    r.fact("recipe_written", recipe_name(rk, rv, src), rk)
    pk, pv = r.first(*keys["fp8_param"])
    r.fact("fp8_param", pv, pk)
    if stack == "skyrl":
        for name in ("fp8", "fp8_recipe", "fp8_param"):
            k, v = r.first(SKYRL_REF_TCK + name, SKYRL_REF_MEGATRON + name)
            r.fact(f"ref.{name}", v, k if k in j.flat else None)


def resolve_recipe(r: Reader, arch: str, gpu_assumed: bool, stack: str):
    """The trainer's concrete recipe (`auto` resolved the stack's way)."""
    j = r.job
    written = j.facts["recipe_written"]
    w = written.value
    if w == "auto":
        resolved = "mxfp8" if arch_major(arch) >= 10 else "blockwise"
        how = f"auto -> {resolved} on {arch}" + (" (assumed: no GPU visible; a GPU-less SkyRL driver leaves it "
                                                  "auto and each worker resolves it)" if gpu_assumed else "")
        return r.fact("recipe", resolved, written.key, how)
    if w is None:
        if j.facts["fp8_training"].value:
            # Megatron-Core's own default (transformer_config.py:573); K21 says so
            return r.fact("recipe", "delayed", written.key, "unset -> Megatron-Core default delayed")
        resolved = "mxfp8" if arch_major(arch) >= 10 else "blockwise"
        return r.fact("recipe", resolved, written.key, f"no FP8 training: the {arch} recipe for the rollout side")
    return r.fact("recipe", w, written.key, written.origin)


# -- the rollout ----------------------------------------------------------------------------------------------------
def read_rollout_skyrl(r: Reader):
    j, src = r.job, r.job.source  # noqa: F841
    mk = SKYRL_ENGINE + "fp8_weight_sync_mode"
    mode = r.val(mk)
    if mode is not None and mode not in SKYRL_WIRES + ("auto", "serialized_blockwise"):
        raise ConfigError(f"{src}: {mk} = {mode!r}: unknown wire format"
                          f"{did_you_mean(mode, SKYRL_WIRES + ('auto',))} (expected blockwise, mxfp8 or auto)")
    r.fact("wire_written", mode, mk)
    recipe = j.facts["recipe"].value
    if mode == "auto":
        wire = "mxfp8" if recipe == "mxfp8" else "blockwise"
        r.fact("wire", wire, mk, f"auto -> {wire} from the policy recipe ({recipe})")
    elif mode == "serialized_blockwise":
        r.fact("wire", "blockwise", mk, "serialized_blockwise (PR #1898's pre-rename name; SkyRL 0.4.0 rejects it: "
                                        "K2)")
    else:
        r.fact("wire", mode, mk)
    wire = j.facts["wire"].value
    qk = SKYRL_EIK + "quantization"
    q = r.val(qk)
    if wire is not None and q is None:
        r.fact("engine_quantization", SKYRL_ENGINE_QUANT[wire], qk,
               f"forced by SkyRL for the {wire} wire (inference_servers/utils.py:83)")
    else:
        r.fact("engine_quantization", q, qk)
    lk = SKYRL_EIK + "load_format"
    if wire is not None and r.val(lk) is None:
        r.fact("load_format", "dummy", lk, "forced by SkyRL under FP8 weight sync (inference_servers/utils.py:86)")
    else:
        r.fact("load_format", r.val(lk), lk)
    r.fact("rollout_format", wire if wire else ("per-tensor" if q == "fp8" else None), mk if wire else qk)
    r.fact("sync", "onpolicy" if wire else "naive", mk)
    k = SKYRL_EIK + "kv_cache_dtype"
    r.fact("kv_cache_dtype", r.val(k), k)


def read_rollout_verl(r: Reader):
    qk = VERL_ROLLOUT + "quantization"
    q = r.val(qk)
    r.fact("engine_quantization", q, qk)
    name_key = VERL_ROLLOUT + "name"
    r.fact("rollout_engine", r.val(name_key, "vllm"), name_key)
    r.fact("rollout_format", "blockwise" if q == "fp8" else None, qk)
    r.fact("sync", "naive", qk, "verl sends BF16 and re-quantizes it in the rollout worker "
                                "(verl/utils/vllm/vllm_quant_utils.py quant_weights)")
    kk = VERL_VLLM_KWARGS + "kv_cache_dtype"
    r.fact("kv_cache_dtype", r.val(kk), kk)
    lk = VERL_ROLLOUT + "load_format"
    r.fact("load_format", r.val(lk), lk)


def read_rollout_nemo(r: Reader):
    pk = NEMO_VLLM + "precision"
    prec = r.val(pk)
    fp8 = prec == "fp8" and r.val("policy.generation.backend", "vllm") == "vllm"
    mx = bool(r.val(NEMO_VLLM + "is_mx")) and fp8
    r.fact("engine_quantization", "fp8" if fp8 else None, pk,
           "vllm_cfg.precision=fp8 -> quantization=fp8 (quantization/fp8.py:306-310)" if fp8 else None)
    r.fact("rollout_format", ("mxfp8" if mx else "blockwise") if fp8 else None, NEMO_VLLM + "is_mx" if mx else pk)
    r.fact("sync", "naive", pk, "NeMo RL sends BF16 and its load_weights re-quantizes every FP8-built weight "
                                "in the vLLM worker (quantization/fp8.py:476-620, cast_tensor_to_fp8_blockwise)")
    kk = NEMO_VLLM + "kv_cache_dtype"
    r.fact("kv_cache_dtype", r.val(kk), kk)
    lk = NEMO_VLLM + "load_format"
    r.fact("load_format", r.val(lk), lk)


# -- parallel sizes, LoRA, importance sampling -----------------------------------------------------------------------
def read_sizes(r: Reader, stack: str):
    def size(name, *keys):
        k, v = r.first(*keys)
        return r.fact(name, 1 if v is None else v, k)
    if stack == "skyrl":
        size("trainer_tp", SKYRL_MEGATRON + "tensor_model_parallel_size")
        size("trainer_cp", SKYRL_MEGATRON + "context_parallel_size")
        size("trainer_pp", SKYRL_MEGATRON + "pipeline_model_parallel_size")
        size("rollout_tp", SKYRL_ENGINE + "tensor_parallel_size")
        size("rollout_ep", SKYRL_ENGINE + "expert_parallel_size")
    elif stack == "verl":
        size("trainer_tp", VERL_MEGATRON + "tensor_model_parallel_size")
        size("trainer_cp", VERL_MEGATRON + "context_parallel_size")
        size("trainer_pp", VERL_MEGATRON + "pipeline_model_parallel_size")
        size("rollout_tp", VERL_ROLLOUT + "tensor_model_parallel_size")
        r.fact("rollout_ep", 1)
    elif stack == "nemo-rl":
        if r.val(NEMO_MEGATRON + "enabled"):
            size("trainer_tp", NEMO_MEGATRON + "tensor_model_parallel_size")
            size("trainer_cp", NEMO_MEGATRON + "context_parallel_size")
        else:
            size("trainer_tp", "policy.dtensor_cfg.tensor_parallel_size")
            r.fact("trainer_cp", 1)
        size("trainer_pp", NEMO_MEGATRON + "pipeline_model_parallel_size")
        size("rollout_tp", NEMO_VLLM + "tensor_parallel_size")
        size("rollout_ep", NEMO_VLLM + "expert_parallel_size")
    else:
        for n in ("trainer_tp", "trainer_cp", "trainer_pp", "rollout_tp", "rollout_ep"):
            r.fact(n, 1)
    for n in ("trainer_tp", "trainer_cp", "trainer_pp", "rollout_tp", "rollout_ep"):
        f = r.job.facts[n]
        if f.value < 1:
            raise ConfigError(f"{r.job.source}: {f.key} must be >= 1, got {f.value}")


def read_lora(r: Reader, stack: str):
    if stack == "skyrl":
        k = "trainer.policy.model.lora.rank"
        mk = SKYRL_MEGATRON + "lora_config.merge_lora"
        r.fact("lora_rank", r.val(k) or 0, k)
        r.fact("lora_merge", r.val(mk, True), mk, None if mk in r.job.flat else
               "SkyRL default True (train/config/config.py:435)")
    elif stack == "verl":
        k, mk = "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.merge"
        r.fact("lora_rank", r.val(k) or 0, k)
        r.fact("lora_merge", r.val(mk, False), mk)
    else:
        r.fact("lora_rank", 0)
        r.fact("lora_merge", True)
    if r.job.facts["lora_rank"].value < 0:
        raise ConfigError(f"{r.job.source}: {r.job.facts['lora_rank'].key} must be >= 0")


def read_correction(r: Reader, stack: str):
    """Is an importance-sampling correction for the sampler/learner mismatch on (TIS and friends)?"""
    if stack == "skyrl":
        k, v = r.first("trainer.algorithm.off_policy_correction.tis_ratio_type", "trainer.algorithm.use_tis")
        on = v in ("token", "sequence") or v is True
    elif stack == "verl":
        k = "algorithm.rollout_correction.rollout_is"
        v = r.val(k)
        on = v in ("token", "sequence")
    elif stack == "nemo-rl":
        k = "loss_fn.use_importance_sampling_correction"
        on = bool(r.val(k))
    else:
        k, on = None, False
    r.fact("is_correction", on, k)


# -- the environment each process group sees -------------------------------------------------------------------------
def read_env(r: Reader, stack: str, arch: str, gpu_assumed: bool):
    j = r.job
    f = j.facts
    nvte, e8m0, dg = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_USE_DEEP_GEMM"
    te_default = ("0", "Transformer Engine default 0 (power-of-two block scales; TE 2.20.2 common/recipe/"
                       "__init__.py:429)")
    vllm_default = "vLLM 0.26 default 1 (vllm/envs.py:1480-1487)"
    if stack == "skyrl":
        wire = f["wire"].value
        contract = bool(f["fp8_training"].value or wire == "blockwise" or f["fp8_param"].value)
        if contract:
            d = "0" if arch_major(arch) >= 10 and not gpu_assumed else "1"
            why = (f"SkyRL default {d} from the driver's GPU (train/utils/utils.py:1110), exported to every actor"
                   if not gpu_assumed else "judged as Hopper's 1: no GPU visible, and SkyRL 0.4.0 refuses a GPU-less "
                   "driver without it (K26)")
            scale = r.env_fact("trainer", "trainer", nvte, d, why)
        else:
            scale = r.env_fact("trainer", "trainer", nvte, *te_default)
        j.facts["env.rollout." + nvte] = j.facts["env.trainer." + nvte]
        if wire == "blockwise" and scale == "1":
            r.env_fact("rollout", "rollout", e8m0, "0", "SkyRL pin 0 for FP32 wire scales (utils.py:1122-1129)")
        elif wire == "blockwise" and scale == "0":
            r.env_fact("rollout", "rollout", e8m0, "1", "SkyRL pin 1 for power-of-two wire scales, any GPU "
                                                          "(utils.py:1130-1146)")
        else:
            r.env_fact("rollout", "rollout", e8m0, "1", vllm_default)
        r.env_fact("rollout", "rollout", dg, "1", vllm_default)
    elif stack == "verl":
        r.env_fact("trainer", "trainer", nvte, *te_default, config_key=VERL_RUNTIME_ENV + nvte)
        r.env_fact("rollout", "rollout", e8m0, "1", vllm_default, config_key=VERL_RUNTIME_ENV + e8m0)
        r.env_fact("rollout", "rollout", dg, "1", vllm_default, config_key=VERL_RUNTIME_ENV + dg)
    elif stack == "nemo-rl":
        r.env_fact("trainer", "trainer", nvte, *te_default, config_key=NEMO_MEGATRON + "env_vars." + nvte)
        forced = f["rollout_format"].value == "blockwise" and bool(r.val(NEMO_VLLM + "use_deep_gemm"))
        why = "forced by NeMo RL use_deep_gemm: true (quantization/fp8.py:240-242)"
        uk = NEMO_VLLM + "use_deep_gemm"
        r.env_fact("rollout", "rollout", e8m0, "1", vllm_default, config_key=NEMO_VLLM + "env_vars." + e8m0,
                   forced=("0", uk, why) if forced else None)
        r.env_fact("rollout", "rollout", dg, "1", vllm_default, config_key=NEMO_VLLM + "env_vars." + dg,
                   forced=("1", uk, why) if forced else None)
    else:
        r.env_fact("trainer", "trainer", nvte, *te_default)
        r.env_fact("rollout", "rollout", e8m0, "1", vllm_default)
        r.env_fact("rollout", "rollout", dg, "1", vllm_default)
    if stack != "skyrl":
        j.facts.setdefault("env.rollout." + nvte, j.facts["env.trainer." + nvte])


def rollout_scales(r: Reader, stack: str) -> str | None:
    """The scale format the rollout engine's FP8 weights carry."""
    f = r.job.facts
    fmt = f["rollout_format"].value
    if fmt == "mxfp8":
        return r.fact("rollout_scales", "e8m0", f["rollout_format"].key)
    if fmt != "blockwise":
        return r.fact("rollout_scales", None)
    if stack == "skyrl":      # the serializer reads the same variable (weight_sync/fp8/quantize.py:20-33)
        e = f["env.trainer.NVTE_FP8_BLOCK_SCALING_FP32_SCALES"]
        return r.fact("rollout_scales", "fp32" if e.value == "1" else "pow2", e.key, e.origin)
    if stack == "nemo-rl":
        k = NEMO_VLLM + "pow2_weight_scaling_factors"
        return r.fact("rollout_scales", "pow2" if r.val(k) else "fp32", k)
    return r.fact("rollout_scales", "fp32", VERL_ROLLOUT + "quantization",
                  "verl's quantizer has no power-of-two option (utils/kernel/fp8_kernel.py)")


# -- what the rollout keeps in BF16 --------------------------------------------------------------------------------
def verl_ignored(spec, engine: str = "vllm") -> list[str] | None:
    """The ignored_layers verl injects: vLLM `model.layers.{i}.mlp.gate` for every i < num_hidden_layers
    (vllm_async_server.py:1071-1088); TRT-LLM none (trtllm_async_server.py:207-220); SGLang's come from the checkpoint
    and SGLANG_FP8_IGNORED_LAYERS (utils/sglang/sglang_fp8_utils.py), which pre-flight does not read: None."""
    if engine == "trtllm":
        return []
    if engine == "sglang":
        return None
    return [f"model.layers.{i}.mlp.gate" for i in range(spec.num_layers)]


def nemo_ignored(r: Reader, spec, modules: list[str]) -> tuple[list[str], dict]:
    """NeMo RL's ignored_layers (quantization/fp8.py:261-300): every GEMM of the first / last N layers, plus every
    module whose name contains a `quantization_ignored_layer_kws` keyword (substring match). Returns the list and
    {keyword: modules it selects}."""
    first = r.val(NEMO_VLLM + "num_first_layers_in_bf16") or 0
    last = r.val(NEMO_VLLM + "num_last_layers_in_bf16") or 0
    for k, v in ((NEMO_VLLM + "num_first_layers_in_bf16", first), (NEMO_VLLM + "num_last_layers_in_bf16", last)):
        if v < 0:
            raise ConfigError(f"{r.job.source}: {k} must be >= 0, got {v}")
    layers = set(range(min(first, spec.num_layers))) | set(range(max(spec.num_layers - last, 0), spec.num_layers))
    out = [m for m in modules if any(m.startswith(spec.layer_prefix(i)) for i in layers)]
    kws = r.val(NEMO_VLLM + "quantization_ignored_layer_kws") or []
    by_kw = {kw: [m for m in modules if kw in m] for kw in kws}
    for sel in by_kw.values():
        out += [m for m in sel if m not in out]
    return out, by_kw


def required_high_precision(spec) -> list[str]:
    """GEMM modules the model must keep high precision (its default exclusion set), less those the engine's model
    class builds unquantized whatever ignored_layers says."""
    from ..models import LINEAR
    mods = sorted({t.module for t in spec.tensors() if t.kind == LINEAR})
    return [m for m in mods if any(matches(m, p) for p in spec.default_exclude)
            and not any(matches(m, p) for p in spec.engine_high_precision)]


def overlap_keys(stack: str) -> tuple[str, str] | None:
    if stack == "nemo-rl":
        return NEMO_DDP + "overlap_grad_reduce", NEMO_DDP + "overlap_param_gather"
    if stack == "skyrl":
        return SKYRL_MEGATRON + "ddp_config.overlap_grad_reduce", SKYRL_MEGATRON + "ddp_config.overlap_param_gather"
    return None

