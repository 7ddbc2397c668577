"""SyncConfig: the one object trainer, rollout and checks read. Built from one mapping (a YAML file, dotted
keys or nested); the exclusion set, recipe and layout map are derived here once and nowhere else.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any


from .errors import ConfigError  # noqa: F401 - raised here, defined with the other input errors
from .formats import Recipe, RecipeError, get_recipe
from .kinds import Granularity, Precision, Quantization, ScaleFormat, member, values
from .models import LINEAR, ModelError, ModelSpec, get_model
from .patterns import matches_any
from .schema import SchemaError, from_data

SYNC_MODES = ("onpolicy", "naive")
_LAYOUTS: dict = {}      # SyncConfig.layout's memo: (its arguments) -> (the spec, the map)
INSTALL_PATHS = ("reload", "load_weights", "weight_source")
# how the engine gets its FP8 weights: a block-FP8 checkpoint it is synced into as-is; BF16 it quantizes itself,
# with vLLM's `fp8_per_block` (per_block_cast_to_fp8, 128x128, each fused parameter whole) or vLLM's `fp8` (one
# dynamic scale per fused parameter; TRL's and SkyRL's naive FP8 rollout), or -- a block-FP8 checkpoint engine
# whose load path quantizes each BF16 checkpoint tensor of a refit -- NeMo RL's FP8 generation
# (harness.numerics.nemo_rl); or none (the engine serves BF16: an FP8 learner's BF16 sampler)
# (harness.kinds.Quantization; the values as plain strings, as error messages list them)
ENGINE_QUANTIZATION = values(Quantization)
# the engine is started from a block-FP8 checkpoint config (quantization_config with ignored_layers)
CHECKPOINT_FORMAT_ENGINES = tuple(q for q in Quantization if q.checkpoint_format)
# fp8: the learner's GEMMs run the recipe; fp8-delayed: Transformer Engine's per-tensor delayed scaling (amax
# history, Megatron-Core's `fp8_recipe="delayed"`: the seeds' naive trainer); bf16: no FP8 in the learner
TRAINER_PRECISIONS = values(Precision)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")     # vLLM 0.26 raises for fp8_e5m2 with an FP8 checkpoint
# where the FP8 KV cache's scales come from: one declared value the engine adapter pins after boot and every wake
# (an uncalibrated checkpoint: 1.0), or the job's per-layer calibration, produced by the trainer at every step and
# carried by every sync as checkpoint tensors `model.layers.N.self_attn.{k,v}_scale` (vLLM's names)
KV_SCALE_SOURCES = ("uniform", "calibrated")


@dataclass(frozen=True)
class TrainerConfig:
    tp_size: int = 1
    cp_size: int = 1
    fp8_param: bool = False          # persistent FP8 parameters (TE quantized_model_init)
    # what the trainer's quantizer really does, when it differs from the recipe (resolved from
    # NVTE_FP8_BLOCK_SCALING_FP32_SCALES and friends); None: as the recipe says
    scale_format: ScaleFormat | None = None
    amax_epsilon: float | None = None
    # the device sync path: masters generated and kept on the trainer's GPU (deterministic from the seed, not the
    # CPU reference's; real shapes), the FP8 export left there
    device: bool = False
    # fp8: the learner's GEMMs run the recipe (TE); bf16: they run BF16 (verl's and NeMo RL's BF16 training with an
    # FP8 rollout); the wire then carries BF16 and the engine quantizes or serves BF16
    precision: Precision = Precision.FP8
    # delayed scaling's knobs (precision fp8-delayed), Megatron-Core 0.19.2's defaults
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    margin: int = 0

    def __post_init__(self):
        # a string is taken as its member once, here (frozen: object.__setattr__); the key is named as SyncConfig
        # holds this part
        p = member(Precision, self.precision)
        if p is None:
            raise ConfigError(f"trainer.precision: {self.precision!r} is not one of {TRAINER_PRECISIONS}")
        object.__setattr__(self, "precision", p)
        if self.scale_format is not None:
            f = member(ScaleFormat, self.scale_format)
            if f is None:
                raise ConfigError(f"trainer.scale_format: {self.scale_format!r} is not one of fp32, pow2, e8m0")
            object.__setattr__(self, "scale_format", f)


@dataclass(frozen=True)
class RolloutConfig:
    """vLLM engine settings that change what the kernels read."""
    tp_size: int = 1
    use_deep_gemm: bool = True       # VLLM_USE_DEEP_GEMM (vLLM 0.26 default on Hopper: on)
    # VLLM_USE_DEEP_GEMM_E8M0: requantize block weights (and round activation scales) to UE8M0. None: the
    # setting that keeps the recipe on-policy (off for FP32 scales, on for power-of-two); vLLM's own default is on
    deep_gemm_e8m0: bool | None = None
    install: str = "reload"          # reload (layerwise reload_weights) | load_weights (direct, first load only) |
    #                                  weight_source (vLLM 0.27+'s trainer-side transfer: a WeightSource, send_weights)
    moe_backend: str = "triton"      # sm90 default for block-FP8 MoE; "deep_gemm" when VLLM_USE_DEEP_GEMM is exported
    # engine quantization_config.weight_block_size; None: the recipe's
    weight_block_size: tuple[int, int] | None = None
    # how the engine serves (the engine as RL stacks run it)
    kv_cache_dtype: str = "auto"     # auto (model dtype) | fp8 | fp8_e4m3: the rollout KV cache
    kv_scale: float = 1.0            # the KV-cache scale the kernels must read (uncalibrated checkpoint: 1.0)
    pin_kv_scales: bool = True       # the engine adapter sets the KV scales to kv_scale after boot and every wake
    kv_scales: str = "uniform"       # uniform (kv_scale, pinned) | calibrated (per layer, from the trainer, synced)
    cuda_graphs: bool = False        # decode replays captured CUDA graphs (vLLM's default path; eager when False)
    sleep_mode: bool = False         # the engine sleeps (level 1 / 2) while the colocated trainer runs
    prefix_caching: bool = True      # vLLM's default; the engine resets the prefix cache after every weight sync
    # checkpoint (block-FP8 bytes installed as-is) | online-per-block | online-per-tensor (BF16 in, the engine
    # quantizes) | nemo-rl-blockwise | none (BF16 served)
    quantization: Quantization = Quantization.CHECKPOINT

    def __post_init__(self):
        q = member(Quantization, self.quantization)     # a string is taken as its member, once
        if q is None:
            raise ConfigError(f"rollout.quantization: {self.quantization!r} is not one of {ENGINE_QUANTIZATION}")
        object.__setattr__(self, "quantization", q)


@dataclass(frozen=True)
class PackingConfig:
    """Pad multiples of packed sequences at each stage; None: the one TP/CP/FP8-aware rule
    (harness.alignment.packed_pad_multiple). Collation, preprocessing and replay must agree."""
    collate_multiple: int | None = None
    preprocess_multiple: int | None = None
    replay_multiple: int | None = None


@dataclass(frozen=True)
class TransportConfig:
    bucket_bytes: int = 4 << 20      # bytes per serialized bucket
    verify_digests: bool = True


@dataclass(frozen=True)
class SyncConfig:
    model: str = "tiny-dense"
    recipe: Recipe = field(default_factory=lambda: get_recipe("blockwise-fp32"))
    sync_mode: str = "onpolicy"
    exclude: tuple[str, ...] = ()    # extra high-precision module patterns, on top of the model's defaults
    default_exclude: bool = True     # keep the model's own high-precision set (routers, GDN a/b projections)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    gpu_arch: str = "auto"           # sm90 (Hopper) | sm100 (Blackwell) | auto: the arch the recipe runs on
    lora_rank: int = 0
    lora_merge: bool = True          # False: adapter-only weight sync
    seed: int = 0

    def __post_init__(self):
        try:
            get_model(self.model)
        except ModelError as e:
            raise ConfigError(f"model: {e}") from None
        if self.sync_mode not in SYNC_MODES:
            raise ConfigError(f"sync_mode: {self.sync_mode!r} is not one of {SYNC_MODES}")
        if self.rollout.install not in INSTALL_PATHS:
            raise ConfigError(f"rollout.install: {self.rollout.install!r} is not one of {INSTALL_PATHS}")
        if self.rollout.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"rollout.kv_cache_dtype: {self.rollout.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        if self.rollout.kv_scales not in KV_SCALE_SOURCES:
            raise ConfigError(f"rollout.kv_scales: {self.rollout.kv_scales!r} is not one of {KV_SCALE_SOURCES}")
        if not 0 < self.rollout.kv_scale < float("inf"):     # NaN fails both comparisons
            raise ConfigError(f"rollout.kv_scale must be finite and > 0, got {self.rollout.kv_scale!r}")
        q, precision = self.rollout.quantization, self.trainer.precision
        if q is Quantization.ONLINE_PER_BLOCK and (
                self.recipe.granularity is not Granularity.BLOCK or tuple(self.recipe.block_shape) != (128, 128)
                or self.recipe.scale_format is not ScaleFormat.FP32):
            raise ConfigError(f"rollout.quantization=online-per-block quantizes 128x128 blocks with FP32 scales; "
                              f"recipe {self.recipe.name!r} is not that (use blockwise-fp32)")
        if q is Quantization.NEMO_RL_BLOCKWISE and (
                self.recipe.granularity is not Granularity.BLOCK or tuple(self.recipe.block_shape) != (128, 128)
                or self.recipe.amax_epsilon != 0):
            raise ConfigError(f"rollout.quantization=nemo-rl-blockwise quantizes 128x128 blocks, FP32 or power-of-two "
                              f"scales, no amax floor; recipe {self.recipe.name!r} is not that (use blockwise-fp32 "
                              f"or blockwise-pow2)")
        if q is Quantization.CHECKPOINT and self.recipe.granularity is Granularity.TENSOR:
            raise ConfigError(f"recipe {self.recipe.name!r} (per-tensor scales) has no on-policy checkpoint sync into "
                              f"vLLM (its FP8 checkpoints fuse q|k|v under one scale and requantize); set "
                              f"rollout.quantization to online-per-tensor, online-per-block or none")
        if precision is Precision.FP8_DELAYED:
            if self.fp8_on_wire:
                raise ConfigError("trainer.precision=fp8-delayed (per-tensor delayed scaling) has no on-policy "
                                  "checkpoint sync into vLLM; set rollout.quantization to online-per-tensor, "
                                  "online-per-block or none")
            try:
                self.delayed_scaling
            except ValueError as e:
                raise ConfigError(f"trainer: {e}") from None
        if q is Quantization.NONE and precision is Precision.BF16 and self.fp8_tensors:
            raise ConfigError("trainer.precision=bf16 with rollout.quantization=none runs no FP8 anywhere; say so "
                              "with the exclusion set (exclude every linear) instead")
        if q is Quantization.CHECKPOINT and precision is Precision.BF16 \
                and self.sync_mode == "onpolicy" and self.fp8_tensors:
            raise ConfigError("trainer.precision=bf16 has no FP8 bytes to install as a checkpoint; set "
                              "rollout.quantization to online-per-tensor, online-per-block or none")
        if self.rollout.moe_backend not in ("triton", "deep_gemm"):
            raise ConfigError(f"rollout.moe_backend: {self.rollout.moe_backend!r} is not one of ('triton', 'deep_gemm')")
        for k in ("trainer", "rollout"):
            if getattr(self, k).tp_size < 1:
                raise ConfigError(f"{k}.tp_size must be >= 1")
        try:
            self.trainer_recipe
        except RecipeError as e:
            raise ConfigError(f"trainer: {e}") from None

    # -- derived once ---------------------------------------------------------------------------------------
    @property
    def fp8_on_wire(self) -> bool:
        """The sync carries FP8 codes and scales (the trainer's own): on-policy into a checkpoint engine. Otherwise
        every tensor goes as BF16 and the engine quantizes (naive, or an online-quantizing engine) or serves it."""
        return self.sync_mode == "onpolicy" and self.rollout.quantization is Quantization.CHECKPOINT

    @property
    def engine_online(self) -> bool:
        """The engine is handed BF16 and quantizes it itself by a declared rule: one of vLLM's online methods, or
        NeMo RL's load path (`engine_quantizes_on_load`). What it must hold is its rule over what it was sent."""
        return self.rollout.quantization.online or self.engine_quantizes_on_load

    @property
    def engine_quantizes_on_load(self) -> bool:
        """The engine quantizes each checkpoint tensor as it arrives, before vLLM's loaders fuse it, and holds the
        result as a block-FP8 checkpoint engine does (NeMo RL's `load_weights`: harness.numerics.nemo_rl)."""
        return self.rollout.quantization is Quantization.NEMO_RL_BLOCKWISE

    @property
    def engine_quantizes(self) -> bool:
        """The engine quantizes the BF16 it receives itself (the round trip's requantization, an online method)."""
        round_trip = self.sync_mode == "naive" and self.rollout.quantization is Quantization.CHECKPOINT
        return self.engine_online or round_trip

    @property
    def trainer_fp8(self) -> bool:
        """The learner's GEMMs run FP8 (its FP8 set is `fp8_tensors`)."""
        return self.trainer.precision is not Precision.BF16

    @property
    def delayed_scaling(self):
        """The learner's delayed-scaling knobs (precision fp8-delayed), else None."""
        if self.trainer.precision is not Precision.FP8_DELAYED:
            return None
        from .formats.delayed import DelayedScaling
        t = self.trainer
        return DelayedScaling(t.margin, t.amax_history_len, t.amax_compute_algo)

    @property
    def wire_is_master(self) -> bool:
        """The wire carries the BF16 parameters (the masters cast), not the FP8 forward weights: every sync that
        does not send FP8 bytes, except the round trip (`sync_mode=naive`), which dequantizes the FP8 forward."""
        return not self.fp8_on_wire and self.sync_mode == "onpolicy"

    @cached_property
    def trainer_fp8_tensors(self) -> frozenset[str]:
        """HF weight names the learner's forward runs as FP8 GEMMs (none for a BF16 learner): the declared FP8 set
        closed under the trainer's fusion (`split_tensors`)."""
        return (self.fp8_tensors | self.split_tensors) if self.trainer_fp8 else frozenset()

    @cached_property
    def split_tensors(self) -> frozenset[str]:
        """Members of a GEMM the trainer fuses (Megatron's linear_qkv, linear_fc1, the GDN in_proj [q|k|v|z|b|a])
        that the exclusion keeps in high precision while another member is FP8. Transformer Engine quantizes the
        fused tensor whole, so the trainer runs them in FP8 and the engine (whose ignored_layers lists them) in
        BF16: the exclusion differs per side. Empty for an exclusion closed under the trainer's fusion; judged by
        X3 and S6 (`trainer_splits`), not refused."""
        return frozenset(m for members in self.trainer_splits.values() for m in members)

    @cached_property
    def trainer_splits(self) -> dict[str, tuple[str, ...]]:
        """Trainer GEMM (Megatron tensor name) -> its members the engine serves in high precision while the trainer
        quantizes the whole GEMM (see `split_tensors`), in checkpoint order."""
        from .layouts.megatron import megatron_pieces
        members: dict[str, list[str]] = {}
        for p in megatron_pieces(self.spec)[0]:
            if p.dst not in members.setdefault(p.src, []):
                members[p.src].append(p.dst)
        linear = {t.name for t in self.spec.tensors() if t.kind == LINEAR}
        out = {}
        for src, ms in members.items():
            gemm = [m for m in ms if m in linear]
            hp = tuple(m for m in gemm if m not in self.fp8_tensors)
            if hp and len(hp) < len(gemm):
                out[src] = hp
        return out

    @cached_property
    def engine_fp8_tensors(self) -> frozenset[str]:
        """HF weight names the engine holds as FP8: the one exclusion set for a checkpoint engine (its
        quantization_config.ignored_layers); none when it serves BF16; for an online method every GEMM the model
        builds with a quant config -- vLLM's `quantization="fp8"` / `"fp8_per_block"` on a BF16 checkpoint take no
        ignored_layers (Fp8Config() defaults), so a router the learner keeps in BF16 is quantized there."""
        q = self.rollout.quantization
        if q is Quantization.NONE:
            return frozenset()
        if self.engine_quantizes_on_load:           # a checkpoint engine: its ignored_layers are the exclusion set
            return self.fp8_tensors
        if self.engine_online:
            out = {t.name for t in self.spec.tensors() if t.kind == LINEAR
                   and not matches_any(t.module, self.spec.engine_high_precision)}
            if q is Quantization.ONLINE_PER_BLOCK:
                out -= self._unblockable()
            return frozenset(out)
        return self.fp8_tensors

    def _unblockable(self) -> set[str]:
        """Checkpoint tensors whose fused engine parameter splits them inside a 128-row block (Qwen3.5's GDN b|a,
        4 rows each at tiny shapes): vLLM says "ba_proj doesn't support blockwise fp8 quantization"
        (layers/mamba/gdn/qwen_gdn_linear_attn.py:411); what its online per-block method then does is not
        measured, so fp8check models them as BF16."""
        from .layouts.pieces import LayoutError
        from .layouts.vllm import vllm_pieces
        bad_params, pieces = set(), []
        for r in range(self.rollout.tp_size):
            for p in vllm_pieces(self.spec, self.rollout.tp_size, r)[0]:
                pieces.append(p)
                try:
                    p.scaled(*self.recipe.block_shape, p.src, p.dst)
                except LayoutError:
                    bad_params.add(p.dst)
        return {p.src for p in pieces if p.dst in bad_params}      # every member of such a parameter

    @cached_property
    def engine_recipe(self) -> Recipe:
        """The grid the engine holds its FP8 weights on: the recipe for a checkpoint engine (and the round trip,
        which requantizes on the recipe's blocks), vLLM's per-tensor online rule (one fp32 scale per fused
        parameter) for online-per-tensor."""
        if self.rollout.quantization is Quantization.ONLINE_PER_TENSOR:
            return Recipe("vllm-online-per-tensor", granularity=Granularity.TENSOR, scale_format=ScaleFormat.FP32)
        return self.recipe

    @cached_property
    def spec(self) -> ModelSpec:
        return get_model(self.model)

    @cached_property
    def exclude_patterns(self) -> tuple[str, ...]:
        base = self.spec.default_exclude if self.default_exclude else ()
        return tuple(dict.fromkeys(base + tuple(self.exclude)))

    @cached_property
    def fp8_tensors(self) -> frozenset[str]:
        """HF weight names carried as FP8 (the wire's, and a checkpoint engine's: its ignored_layers are the rest):
        GEMM weights not matched by an exclusion pattern. The trainer's set is this one closed under its fusion
        (`trainer_fp8_tensors`, `split_tensors`)."""
        return frozenset(t.name for t in self.spec.tensors()
                         if t.kind == LINEAR and not matches_any(t.module, self.exclude_patterns))

    @cached_property
    def fp8_tensor_names(self) -> tuple[str, ...]:
        """`fp8_tensors` in checkpoint order (the checks walk it every sync: ~1500 expert weights at Qwen3-30B-A3B)."""
        return tuple(t.name for t in self.spec.tensors() if t.name in self.fp8_tensors)

    @cached_property
    def high_precision(self) -> frozenset[str]:
        """Every other HF tensor (norms, embeddings, excluded linears): BF16 on the wire and in the engine."""
        return frozenset(t.name for t in self.spec.tensors()) - self.fp8_tensors

    @cached_property
    def ignored_layers(self) -> tuple[str, ...]:
        """vLLM `quantization_config.ignored_layers`: HF module names of GEMMs kept high precision (a checkpoint
        engine's; an engine that quantizes online or serves BF16 is started with none)."""
        if not self.rollout.quantization.checkpoint_format:
            return ()
        return tuple(sorted(t.module for t in self.spec.tensors()
                            if t.kind == LINEAR and t.name not in self.fp8_tensors))

    @cached_property
    def trainer_recipe(self) -> Recipe:
        """The quantizer the trainer really runs: the recipe unless trainer.scale_format / amax_epsilon say
        otherwise (a disagreement the C checks exist to catch)."""
        t = self.trainer
        if t.precision is Precision.FP8_DELAYED:       # one fp32 scale per tensor, from the amax history
            return Recipe("te-delayed", fp8_format=self.recipe.fp8_format, granularity=Granularity.TENSOR,
                          scale_format=ScaleFormat.FP32)
        if t.scale_format is None and t.amax_epsilon is None:
            return self.recipe
        ch = {}
        if t.scale_format is not None:
            ch["scale_format"] = t.scale_format
        if t.amax_epsilon is not None:
            ch["amax_epsilon"] = t.amax_epsilon
        return replace(self.recipe, **ch)

    @property
    def arch(self) -> str:
        return self.recipe.native_arch if self.gpu_arch == "auto" else self.gpu_arch

    @property
    def deep_gemm_e8m0(self) -> bool:
        e = self.rollout.deep_gemm_e8m0
        return (self.recipe.scale_format is ScaleFormat.POW2) if e is None else e

    @property
    def requant_ue8m0(self) -> bool:
        """The engine requantizes block-FP8 weights to UE8M0 after loading (DeepGEMM + E8M0 mode)."""
        return self.engine_recipe.granularity is Granularity.BLOCK and bool(self.engine_fp8_tensors) and \
            self.rollout.use_deep_gemm and self.deep_gemm_e8m0

    @property
    def fp8_kv_cache(self) -> bool:
        return self.rollout.kv_cache_dtype.startswith("fp8")

    @property
    def calibrated_kv(self) -> bool:
        """Per-layer KV-cache scales from the trainer travel with every sync."""
        return self.fp8_kv_cache and self.rollout.kv_scales == "calibrated"

    @cached_property
    def kv_scale_names(self) -> tuple[str, ...]:
        """Checkpoint names of the calibrated KV-cache scales one sync carries (none without calibration)."""
        if not self.calibrated_kv:
            return ()
        return tuple(f"{self.spec.layer_prefix(i)}self_attn.{w}_scale" for i, lt in enumerate(self.spec.layer_types)
                     if lt == "full_attention" for w in ("k", "v"))

    @property
    def lora_adapter_only(self) -> bool:
        return self.lora_rank > 0 and not self.lora_merge

    @cached_property
    def layout(self):
        """The layout map, one per distinct set of its arguments in a process: configs rebuilt from their dict
        (every sync on the device path) share it, and with it what checks and captures derive from it once
        (`_geometry`, S2's declared parameters), which is pure data of the map."""
        from .layouts import LayoutMap
        trainer_fp8 = self.fp8_tensors | self.split_tensors     # the trainer's side: closed under its fusion
        key = (id(self.spec), trainer_fp8, tuple(self.recipe.block_shape), self.rollout.tp_size,
               self.engine_recipe.granularity, self.engine_fp8_tensors, self.trainer_recipe.granularity,
               self.split_tensors)
        hit = _LAYOUTS.get(key)
        if hit is not None and hit[0] is self.spec:
            return hit[1]
        layout = LayoutMap(self.spec, trainer_fp8, self.recipe.block_shape, tp=self.rollout.tp_size,
                           engine_granularity=self.engine_recipe.granularity, engine_fp8_hf=self.engine_fp8_tensors,
                           trainer_granularity=self.trainer_recipe.granularity, shared_scale_hf=self.split_tensors)
        if len(_LAYOUTS) >= 64:                 # a bounded memo (a fault matrix spans a few dozen)
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = (self.spec, layout)     # the spec held: its id stays its own
        return layout

    def vllm_quantization_config(self) -> dict:
        """What the rollout engine is started with (HF config.json `quantization_config`)."""
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": self.recipe.fp8_format,
                "weight_block_size": list(self.recipe.block_shape), "ignored_layers": list(self.ignored_layers)}

    # -- (de)serialization ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain data (kinds as their strings, so YAML and pickles need no fp8check types); `from_dict` reads it
        back to an equal config."""
        d = asdict(self, dict_factory=lambda kv: {k: v.value if isinstance(v, Enum) else v for k, v in kv})
        d["recipe"] = {"name": self.recipe.name, **{k: v for k, v in d["recipe"].items() if k != "name"}}
        d["exclude"] = list(self.exclude)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "SyncConfig":
        """Nested or dotted keys, validated by the field annotations (harness.schema: the one validator, the
        records' too). Unknown keys, wrong types and values outside a kind are a one-line ConfigError naming
        `source`, the key path and what was expected (never silently ignored)."""
        data = nest(data, source)
        try:
            return from_data(cls, data, "")
        except (SchemaError, ConfigError) as e:     # ConfigError: a part's own rule (__post_init__)
            raise ConfigError(f"{source}: {e}") from None

    def with_(self, **changes) -> "SyncConfig":
        return replace(self, **changes)


def recommended_config(model: str, recipe: str, **kw) -> SyncConfig:
    """The recommended configuration for a recipe: its native GPU arch (Hopper for blockwise, Blackwell for
    MXFP8); vLLM's E8M0 path off for FP32 scales and on for power-of-two scales (SyncConfig's default
    resolution). Clean runs of the fault matrix, conformance and live sessions start from it."""
    r = get_recipe(recipe)
    return SyncConfig(model=model, recipe=r, gpu_arch=kw.pop("gpu_arch", r.native_arch), **kw)


def nest(data: dict, source: str = "config") -> dict:
    """Dotted keys -> nested mappings (`rollout.tp_size: 2` == `rollout: {tp_size: 2}`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    out: dict = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise ConfigError(f"{source}: key {k!r} is not a string")
        if isinstance(v, dict):
            v = nest(v, source)
        cur = out
        parts = k.split(".")
        for p in parts[:-1]:
            nxt = cur.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{source}: key {k!r} conflicts with a scalar at {p!r}")
            cur = nxt
        leaf = parts[-1]
        if isinstance(v, dict) and isinstance(cur.get(leaf), dict):
            cur[leaf] = _merge(cur[leaf], v)
        else:
            cur[leaf] = v
    return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
