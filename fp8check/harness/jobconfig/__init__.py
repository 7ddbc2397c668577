"""An RL job's FP8 configuration in its own language (SkyRL, verl or NeMo RL keys, nested or dotted; a NeMo RL
`defaults:` chain of local files and `${a.b}` references resolved) plus the process environment, resolved the way
each stack resolves it, into the one SyncConfig the checks read -- with the provenance of every value, so a failed
rule can name the key or variable to change and `fp8check preflight --explain` can say where each value came from.

SkyRL 0.4.0 (skyrl/train/config/config.py, FP8 sync PRs #1898 / #2072): trainer.{policy,ref}.megatron_config.{fp8,
fp8_recipe, fp8_param} (or the same under transformer_config_kwargs, which win), ddp_config.fp8_param_gather, parallel
sizes, lora, trainer.mtp.enabled; generator.inference_engine.{fp8_weight_sync_mode, tensor_parallel_size,
weight_sync_backend, speculative_config, engine_init_kwargs.*}.
verl: actor_rollout_ref.actor.megatron.override_transformer_config.{fp8, fp8_recipe, fp8_param},
actor_rollout_ref.rollout.{name, quantization, tensor_model_parallel_size, engine_kwargs.vllm.*},
actor_rollout_ref.model.{path, lora_rank}, algorithm.rollout_correction.rollout_is, ray_kwargs.ray_init.runtime_env.
NeMo RL: policy.generation.vllm_cfg.{precision, kv_cache_dtype, is_mx, use_deep_gemm, pow2_*, num_*_layers_in_bf16,
quantization_ignored_layer_kws, env_vars, ...}, policy.megatron_cfg.{fp8_cfg.*, env_vars, parallel sizes,
distributed_data_parallel_config.*}, policy.model_name, loss_fn.use_importance_sampling_correction.
fp8check's own keys (exclude, packing, amax_epsilon, model, seed) go under `fp8check.`.
The key lists are harness/jobconfig/keys.py; each stack's defaults harness/jobconfig/defaults.py; the per-stack
resolution harness/jobconfig/stacks.py; the version of each stack judged, and where SkyRL 0.4.0 refuses an FP8
configuration, harness/jobconfig/versions.py.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from ..config import ConfigError, PackingConfig, RolloutConfig, SyncConfig, TrainerConfig
from ..patterns import matches
from ..formats import get_recipe
from ..kinds import Granularity, Precision, Quantization, ScaleFormat
from ..models import LINEAR, MODELS, SHIPPED, ModelError, get_model
from . import skyrl_spec, stacks
from .defaults import STACK_DEFAULTS
from .keys import (ENV_KNOWN, FP8_PREFIXES, KEY_KINDS, KNOWN, NEMO_VLLM, OPEN_SUBTREES, SKYRL_ENGINE,
                   SKYRL_MEGATRON, SKYRL_QCFG, SKYRL_REF_MEGATRON)
from .source import flatten, interpolate, with_defaults
from .stacks import CHECKED_RECIPES, Fact

__all__ = ["ENV_KNOWN", "FP8_PREFIXES", "KEY_KINDS", "KNOWN", "OPEN_SUBTREES", "SKYRL_ENGINE", "SKYRL_MEGATRON",
           "SKYRL_REF_MEGATRON", "Fact", "Job", "Line", "detect_gpu", "flatten", "parse_job"]

ARCHS = ("sm90", "sm100", "sm120")


@dataclass
class Line:
    """One pre-flight verdict line."""
    level: str                 # ok | error | warning | n/a (the rule has nothing to judge in this job; `why` says why)
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
    """An RL job's FP8 configuration as read: the SyncConfig it resolves to, every key (written, inherited or a
    stack default) with where it came from, and the typed facts the job rules judge (invariants/job/). Rules read
    through `value` / `fact`, which record what they read (the provenance `--explain` prints)."""
    config: SyncConfig | None
    source: str = "config"
    stack: str = "fp8check"                         # skyrl | verl | nemo-rl | fp8check: whose keys these are
    flat: dict = field(default_factory=dict)        # every key as read, dotted
    origin: dict = field(default_factory=dict)      # key -> where its value came from
    facts: dict = field(default_factory=dict)       # name -> Fact
    sources: dict = field(default_factory=dict)     # SyncConfig field -> (key or variable, value)
    unresolved: dict = field(default_factory=dict)  # key fp8check reads -> why its value could not be resolved
    env: dict = field(default_factory=dict)         # the driver's environment (os.environ + --env)
    env_origin: dict = field(default_factory=dict)  # variable -> environment | --env
    reads: list = field(default_factory=list)       # ("key" | "fact", name), in the order rules read them

    def value(self, key: str, default=None):
        self.reads.append(("key", key))
        return self.flat.get(key, default)

    def has(self, key: str) -> bool:
        self.reads.append(("key", key))
        return key in self.flat

    def written(self, key: str) -> bool:
        """The user wrote the key (in the file, a parent file or --set), as opposed to a stack default."""
        return key in self.flat and not self.origin.get(key, "").startswith(("SkyRL default", "verl default",
                                                                              "NeMo RL default"))

    def getenv(self, name: str):
        """A variable of the driver's environment (os.environ + --env), recorded like a key."""
        self.reads.append(("env", name))
        return self.env.get(name)

    def fact(self, name: str) -> Fact:
        self.reads.append(("fact", name))
        return self.facts.get(name) or Fact(None, None, "not resolved for this job")

    def get(self, name: str):
        return self.fact(name).value

    def provenance(self, kind: str, name: str) -> tuple[str, object, str]:
        """(key as written, value, origin) for a read key or fact."""
        if kind == "fact":
            f = self.facts.get(name)
            return (f.key or "-", f.value, f.origin) if f else (name, None, "not resolved for this job")
        if kind == "env":
            return name, self.env.get(name), self.env_origin.get(name, "driver environment") \
                if self.env.get(name) not in (None, "") else "not set in the driver's environment"
        return name, self.flat.get(name), self.origin.get(name, "not written (the rule's default applies)")


NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg")   # Linux, and WSL2's GPU


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver at all: without one no CUDA GPU can be visible, and detecting that
    costs no `import torch` (2.5-2.9 s on a laptop, longer than pre-flight's rules)."""
    return any(os.path.exists(p) for p in NVIDIA_DRIVER_PATHS)


def detect_gpu() -> tuple[str, str] | None:
    """(smNN, device name) of the first visible CUDA GPU, None when none is visible (or torch is missing)."""
    if not nvidia_driver_present() or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return None
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}", torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001 - no usable torch.cuda: no GPU
        pass
    return None


def _stack(flat: dict) -> str:
    if any(k.startswith(("trainer.", "generator.")) for k in flat):
        return "skyrl"
    if any(k.startswith("actor_rollout_ref.") for k in flat):
        return "verl"
    if any(k.startswith("policy.") for k in flat):
        return "nemo-rl"
    return "fp8check"


_KIND_OK = {
    "bool": lambda x: isinstance(x, bool), "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "str": lambda x: isinstance(x, str), "list": lambda x: isinstance(x, list),
    "strlist": lambda x: isinstance(x, list) and all(isinstance(i, str) for i in x),
    "dict": lambda x: isinstance(x, dict), "any": lambda x: True, "fp8": lambda x: isinstance(x, (str, bool)),
    "num": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
}
_KIND_WORDS = {"strlist": "a list of strings", "dict": "a mapping", "num": "a number", "fp8": "e4m3 or hybrid",
               "int": "an integer"}


def _check_kinds(flat: dict, origin: dict, source: str) -> None:
    for k, v in flat.items():
        kind = KEY_KINDS.get(k)
        if kind is None or v is None or _KIND_OK[kind](v):
            continue
        where = origin.get(k, "")
        src = where.split(" from ", 1)[1] if where.startswith("inherited from ") else source
        raise ConfigError(f"{src}: {k} must be {_KIND_WORDS.get(kind, kind)}, got {v!r}")


def _model(r: stacks.Reader, base_dir: str | None) -> str:
    """The model the job trains: a model name (harness.models.get_model: built-in, shipped, NAME@<N>L), a hub id of
    a shipped config (Qwen/Qwen3-8B: its public shapes), or a local checkpoint / config.json (registered; a relative
    path from the job file's directory too); anything else is unknown here (tiny-dense's dims are used)."""
    job, flat, source = r.job, r.job.flat, r.job.source
    key = next((k for k in ("fp8check.model", "trainer.policy.model.path", "actor_rollout_ref.model.path",
                            "policy.model_name") if k in flat), None)
    name = flat.get(key) if key else "tiny-dense"
    if not isinstance(name, str):
        raise ConfigError(f"{source}: {key} must be a string, got {name!r}")
    r.fact("model", name, key, job.origin.get(key, "fp8check default tiny-dense") if key else "fp8check default")
    hub = name.rsplit("/", 1)[-1].lower()
    candidates = [name] + ([os.path.join(base_dir, name)] if base_dir and not os.path.isabs(name) else [])
    if not any(os.path.exists(c) for c in candidates) and name not in MODELS and hub in SHIPPED:
        candidates = [hub]
    for cand in candidates:
        if cand in MODELS or cand in SHIPPED or "@" in cand or os.path.exists(cand):
            try:
                spec = get_model(cand)
            except ModelError as e:
                raise ConfigError(f"{key or 'model'}: {e}") from None
            r.fact("model_known", True, key, f"dims of {spec.name}")
            return spec.name
    r.fact("model_known", False, key, "not a known model name nor a local config.json: checks use tiny-dense")
    return "tiny-dense"


def config_from_job(path: str, *, sets: dict | None = None, env: dict | None = None, gpu: str = "auto") -> SyncConfig:
    """The SyncConfig of an RL job file (SkyRL, verl or NeMo RL keys), read exactly as `fp8check preflight` reads
    it: recipe and trainer scale format, the engine's DeepGEMM / E8M0 settings, exclusion set, model, parallel
    sizes. `env`: the workers' environment (default: this process's); `sets`: dotted-key overrides; `gpu`: the
    workers' GPU (sm90 | sm100 | auto). Bad input (a missing file, an unknown FP8 key value) raises one-line
    errors naming the key."""
    import os
    from .source import load_job_file
    job = parse_job(load_job_file(path), dict(os.environ if env is None else env), gpu, source=path, sets=sets,
                    base_dir=os.path.dirname(os.path.abspath(path)))
    return job.config


def parse_job(data: dict, env: dict, gpu: str = "auto", source: str = "config", sets: dict | None = None,
              env_origin: dict | None = None, base_dir: str | None = None) -> Job:
    """Read a SkyRL / verl / NeMo RL job config + environment into a Job: the SyncConfig, the provenance of every
    value and the facts the job rules judge. Type errors are ConfigError naming the key as the user wrote it.
    `sets`: --set overrides (dotted keys); `env_origin`: variable -> where it was set; `base_dir`: where
    `defaults:` parents and relative model paths are looked up (the job file's directory)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of keys, got {type(data).__name__}")
    for k in env:
        if not isinstance(k, str) or not k or "=" in k:
            raise ConfigError(f"environment: {k!r} is not a variable name")
    flat, origin, unres_parents = with_defaults(data, base_dir, source)
    for k, v in (sets or {}).items():
        add = flatten({k: v}, source="--set") if isinstance(v, dict) and v else {k: v}
        for a in list(flat):
            if any(a.startswith(n + ".") or n.startswith(a + ".") for n in add):
                flat.pop(a)
        flat.update(add)
        origin.update({n: "--set" for n in add})
    job = Job(None, source, _stack(flat), flat, origin, env=dict(env), env_origin=dict(env_origin or {}))
    defaults, label = STACK_DEFAULTS.get(job.stack, ({}, ""))
    for k, v in defaults.items():
        if k not in flat:
            flat[k] = v
            origin[k] = label
    for k, why in interpolate(flat, origin).items():
        if k in KEY_KINDS:
            job.unresolved[k] = f"{why} ({origin.get(k, 'written')})"
            flat.pop(k)
    for p, why in unres_parents:
        job.unresolved[f"defaults: {p}"] = why
    _check_kinds(flat, origin, source)
    r = stacks.Reader(job, job.env, job.env_origin)

    # -- the GPU the workers run on ------------------------------------------------------------------------------
    if gpu != "auto":
        if gpu not in ARCHS:
            raise ConfigError(f"--gpu {gpu}: expected sm90, sm100, sm120 or auto")
        arch, how, assumed = gpu, "--gpu", False
    else:
        seen = detect_gpu()
        arch, how, assumed = (seen[0], f"detected {seen[1]}", False) if seen else \
            ("sm90", "no GPU visible: assumed Hopper (pass --gpu sm100 for Blackwell)", True)
    r.fact("gpu", arch, "--gpu", how)
    r.fact("gpu_assumed", assumed, "--gpu", how)
    job.sources["gpu_arch"] = ("--gpu" if gpu != "auto" else "GPU", f"{arch} ({how})")

    # -- trainer, rollout, sizes, environment ----------------------------------------------------------------------
    stack = job.stack
    stacks.read_trainer(r, stack)
    stacks.resolve_recipe(r, arch, assumed, stack)
    {"skyrl": stacks.read_rollout_skyrl, "verl": stacks.read_rollout_verl,
     "nemo-rl": stacks.read_rollout_nemo}.get(stack, _read_rollout_none)(r)
    stacks.read_sizes(r, stack)
    stacks.read_lora(r, stack)
    stacks.read_correction(r, stack)
    stacks.read_env(r, stack, arch, assumed)
    stacks.rollout_scales(r, stack)
    model_name = _model(r, base_dir)
    f = job.facts
    job.sources["recipe"] = (f["recipe"].key or "fp8_recipe", f"{f['recipe'].value} ({f['recipe'].origin})")
    for name, field_ in (("trainer_tp", "trainer.tp_size"), ("trainer_cp", "trainer.cp_size"),
                         ("rollout_tp", "rollout.tp_size")):
        job.sources[field_] = (f[name].key or "-", f[name].value)
    job.sources["lora"] = (f["lora_rank"].key or "-", f"rank {f['lora_rank'].value}, merge {f['lora_merge'].value}")
    if f["fp8_param"].key in flat:
        job.sources["trainer.fp8_param"] = (f["fp8_param"].key, f["fp8_param"].value)
    job.sources["model"] = (f["model"].key or "-", f"{f['model'].value} ({f['model_known'].origin})"
                            if not f["model_known"].value else f["model"].value)
    job.sources["sync_mode"] = (f["sync"].key or "-", f"{f['sync'].value} ({f['sync'].origin})")
    job.config = _sync_config(r, model_name)
    return job


def _read_rollout_none(r: stacks.Reader):
    for name in ("engine_quantization", "rollout_format", "kv_cache_dtype", "load_format"):
        r.fact(name, None)
    r.fact("sync", "naive", None, "fp8check keys only: no rollout FP8 settings")


def _sync_config(r: stacks.Reader, model_name: str) -> SyncConfig:
    job, flat, source, f = r.job, r.job.flat, r.job.source, r.job.facts
    from ..models import get_model
    spec = get_model(model_name)
    # the sync's recipe: the FP8 the rollout serves (the trainer's when the rollout is not FP8)
    trainer_recipe = f["recipe"].value if f["recipe"].value in CHECKED_RECIPES else \
        ("mxfp8" if stacks.arch_major(f["gpu"].value) >= 10 else "blockwise")
    nvte = f["env.trainer.NVTE_FP8_BLOCK_SCALING_FP32_SCALES"]
    trainer_scales = ScaleFormat.FP32 if nvte.value == "1" else ScaleFormat.POW2
    fmt, rscales = f["rollout_format"].value, f["rollout_scales"].value
    if fmt == "mxfp8":
        name = "mxfp8"
    elif fmt == "blockwise":
        name = "blockwise-pow2" if rscales == "pow2" else "blockwise-fp32"
    else:
        name = "mxfp8" if trainer_recipe == "mxfp8" else f"blockwise-{trainer_scales}"
    recipe = get_recipe(name)
    fp8_trainer = bool(f["fp8_training"].value)
    scale_applies = recipe.granularity is Granularity.BLOCK and (fp8_trainer or job.stack in ("skyrl", "fp8check"))
    if fmt:
        job.sources["recipe"] = (f["rollout_format"].key, f"{name} (the rollout's FP8; trainer recipe "
                                 f"{f['recipe'].value if fp8_trainer else 'none: BF16 training'})")
    job.sources["trainer.scale_format"] = (nvte.key, f"{nvte.value} ({nvte.origin})" if scale_applies else
                                           f"{nvte.value} (not applied: " + ("the trainer runs BF16)" if not fp8_trainer
                                                                              else "MXFP8 scales are E8M0)"))
    eps_key = "fp8check.amax_epsilon"
    if eps_key in flat:
        v = flat[eps_key]
        if not v >= 0:
            raise ConfigError(f"{source}: {eps_key} must be a number >= 0, got {v!r}")
        recipe = replace(recipe, amax_epsilon=float(v))
        job.sources["recipe.amax_epsilon"] = (eps_key, v)
    eps_env = job.env.get("NVTE_FP8_BLOCK_AMAX_EPSILON")
    if eps_env not in (None, ""):
        try:
            ok = float(eps_env) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"environment: NVTE_FP8_BLOCK_AMAX_EPSILON={eps_env!r} must be a number >= 0")
    dg, e8 = f["env.rollout.VLLM_USE_DEEP_GEMM"], f["env.rollout.VLLM_USE_DEEP_GEMM_E8M0"]
    vllm_engine = job.stack != "verl" or f.get("rollout_engine", Fact("vllm")).value == "vllm"
    job.sources["rollout.use_deep_gemm"] = (dg.key, f"{dg.value} ({dg.origin})")
    job.sources["rollout.deep_gemm_e8m0"] = (e8.key, f"{e8.value} ({e8.origin})")
    moe_dg = job.env.get("VLLM_MOE_USE_DEEP_GEMM")
    if moe_dg not in (None, "", "0", "1"):
        raise ConfigError(f"environment: VLLM_MOE_USE_DEEP_GEMM={moe_dg!r} must be 0 or 1")
    exclude, default_exclude = _exclusion(r, spec)
    bs = flat.get(SKYRL_QCFG + "weight_block_size")
    if bs is not None and (len(bs) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                   for x in bs)):
        raise ConfigError(f"{source}: {SKYRL_QCFG}weight_block_size must be two positive integers like [128, 128], "
                          f"got {bs!r}")
    pk = {}
    for k in flat:
        if k.startswith("fp8check.packing."):
            if flat[k] < 1:
                raise ConfigError(f"{source}: {k} must be >= 1, got {flat[k]}")
            pk[k.rsplit(".", 1)[1]] = flat[k]
            job.sources["packing." + k.rsplit(".", 1)[1]] = (k, flat[k])
    seed = flat.get("fp8check.seed") or 0
    if seed < 0:
        raise ConfigError(f"{source}: fp8check.seed must be >= 0, got {seed}")
    # how the engine gets FP8: an FP8 learner's engine that is not FP8 at all is a BF16 sampler; SkyRL without an
    # FP8 weight sync hands vLLM (quantization=fp8 on a BF16 checkpoint) BF16 to quantize online, per tensor
    quantization = Quantization.CHECKPOINT
    if fp8_trainer and not fmt:
        quantization = Quantization.NONE
    elif job.stack == "skyrl" and fmt and f["sync"].value == "naive":
        quantization = Quantization.ONLINE_PER_TENSOR
    elif job.stack == "nemo-rl" and fmt == "blockwise":
        # a block-FP8 checkpoint engine whose load_weights quantizes each BF16 tensor of the refit
        quantization = Quantization.NEMO_RL_BLOCKWISE
        job.sources["rollout.quantization"] = (f["rollout_format"].key, "nemo-rl-blockwise (NeMo RL's load_weights "
                                               "quantizes each BF16 tensor: cast_tensor_to_fp8_blockwise, "
                                               "quantization/fp8.py:476-620)")
    precision = Precision.FP8
    if quantization is not Quantization.CHECKPOINT:   # (a checkpoint engine installs FP8 bytes: some sender made them)
        precision = (Precision.FP8_DELAYED if f["recipe"].value == "delayed" else Precision.FP8) if fp8_trainer \
            else Precision.BF16
    try:
        return SyncConfig(
            model=model_name, recipe=recipe, sync_mode=f["sync"].value, exclude=tuple(exclude),
            default_exclude=default_exclude,
            trainer=TrainerConfig(tp_size=f["trainer_tp"].value, cp_size=f["trainer_cp"].value,
                                  fp8_param=bool(f["fp8_param"].value), precision=precision,
                                  scale_format=trainer_scales if scale_applies else None),
            rollout=RolloutConfig(tp_size=f["rollout_tp"].value, use_deep_gemm=vllm_engine and dg.value == "1",
                                  quantization=quantization,
                                  deep_gemm_e8m0=e8.value == "1",
                                  moe_backend="deep_gemm" if moe_dg == "1" else "triton",
                                  weight_block_size=tuple(bs) if bs is not None else None),
            packing=PackingConfig(**pk), gpu_arch=f["gpu"].value, lora_rank=f["lora_rank"].value,
            lora_merge=bool(f["lora_merge"].value), seed=seed)
    except (TypeError, ModelError) as e:
        raise ConfigError(f"{source}: {e}") from None


def _exclusion(r: stacks.Reader, spec) -> tuple[list, bool]:
    """(exclude patterns, keep the model's defaults): the high-precision set of the FP8 the sync carries, as the
    stack derives it. SkyRL with an FP8 wire: what its per-model FP8 spec keeps in BF16 (`skyrl_spec`; a model
    without a spec keeps the model's own set, K19 says SkyRL refuses it); verl and NeMo RL: the ignore list each
    injects into the engine; each plus what the engine always builds unquantized."""
    job, f, flat = r.job, r.job.facts, r.job.flat
    user = list(flat.get("fp8check.exclude") or [])
    if user:
        job.sources["exclude"] = ("fp8check.exclude", user)
    mods = sorted({t.module for t in spec.tensors() if t.kind == LINEAR})
    forced = [m for m in mods if any(matches(m, p) for p in spec.engine_high_precision)]
    injected = stacks.verl_ignored(spec, f["rollout_engine"].value) if job.stack == "verl" else None
    if injected is not None and f["rollout_format"].value:
        r.fact("rollout_ignored", injected, "actor_rollout_ref.rollout.quantization",
               f"injected by verl's {f['rollout_engine'].value} server")
        eff = [m for m in injected if m in mods]
        job.sources["exclude"] = ("actor_rollout_ref.rollout.quantization",
                                  f"verl's ignored_layers ({len(eff)} of {len(injected)} name a GEMM)")
        return eff + [m for m in forced if m not in eff] + user, False
    if job.stack == "nemo-rl" and f["rollout_format"].value:
        ign, by_kw = stacks.nemo_ignored(r, spec, mods)
        r.fact("rollout_ignored", ign, NEMO_VLLM + "quantization_ignored_layer_kws",
               "NeMo RL: layers of num_first/last_layers_in_bf16 + substring matches of the keywords "
               "(quantization/fp8.py:261-300)")
        r.fact("ignored_by_kw", by_kw, NEMO_VLLM + "quantization_ignored_layer_kws")
        job.sources["exclude"] = (NEMO_VLLM + "quantization_ignored_layer_kws", f"{len(ign)} module(s)")
        return ign + [m for m in forced if m not in ign] + user, False
    wire = f["wire"].value if job.stack == "skyrl" and "wire" in f else None
    spec_excl = skyrl_spec.skyrl_exclusion(spec, wire) if wire else None
    if spec_excl is not None:
        # SkyRL's per-model FP8 spec decides what its sync quantizes (and the engine's ignored_layers): X3 and S6
        # judge that exclusion, which splits the GDN in_proj Megatron quantizes whole
        r.fact("rollout_ignored", spec_excl, SKYRL_ENGINE + "fp8_weight_sync_mode",
               f"SkyRL {skyrl_spec.SKYRL_VERSION}'s {spec.model_type} FP8 spec ({skyrl_spec.SPEC_SOURCE})")
        job.sources["exclude"] = (SKYRL_ENGINE + "fp8_weight_sync_mode",
                                  f"SkyRL {skyrl_spec.SKYRL_VERSION}'s FP8 spec for {spec.model_type} "
                                  f"({len(spec_excl)} module(s) in high precision)")
        excl = spec_excl + [m for m in forced if m not in spec_excl] + user
    else:
        r.fact("rollout_ignored", None)
        excl = None
    ik = SKYRL_QCFG + "ignored_layers"
    if ik in flat:
        r.fact("ignored_layers_override", flat[ik], ik)
    return (excl, False) if excl is not None else (user, True)

