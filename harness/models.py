"""Embedded tiny models, built in code (no downloads): shapes, names and roles of every tensor.

Names are the HF checkpoint names the trainer exports and vLLM's loaders accept. Every GEMM dim is a
multiple of 128 (one 128x128 block row per attention head), so fused tensors split on block boundaries.
Shapes are chosen so that layout faults cannot hide behind shape checks: q, k, v, o are all [512, 512]
in tiny-dense (a square projection and q/k of equal size), gate and up share a shape everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


class ModelError(ValueError):
    """Unknown model name or inconsistent model spec."""


# kind of a tensor: decides whether the FP8 recipe can apply to it at all
LINEAR = "linear"          # GEMM weight [out, in]: quantizable unless excluded
EMBEDDING = "embedding"    # vocab-parallel embedding / lm head: never quantized by the fp8 method
NORM = "norm"
CONV = "conv"
PARAM = "param"            # other plain parameters (A_log, dt_bias)


@dataclass(frozen=True)
class TensorSpec:
    name: str              # HF checkpoint name, e.g. model.layers.0.self_attn.q_proj.weight
    shape: tuple[int, ...]
    kind: str

    @property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str                  # HF / vLLM architecture class
    model_type: str                    # HF config model_type
    vocab_size: int = 2048
    hidden_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 1024
    qk_norm: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # MoE
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # hybrid (gated delta-net) layers
    layer_types: tuple[str, ...] = ()
    linear_num_k_heads: int = 0
    linear_num_v_heads: int = 0
    linear_head_dim: int = 128
    linear_conv_kernel: int = 4
    attn_output_gate: bool = False     # Qwen3.5 full attention: q_proj also produces a sigmoid gate
    # tensors kept in high precision by default (module-name patterns, see harness.config)
    default_exclude: tuple[str, ...] = ()
    # modules the vLLM model class builds without a quant config, whatever ignored_layers says
    engine_high_precision: tuple[str, ...] = ()
    live: bool = True                  # served by vLLM 0.26 on the GPU machine (else CPU reference only)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelError(f"model {self.name!r}: {len(self.layer_types)} layer_types for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"model {self.name!r}: num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_k_heads * self.linear_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_v_heads * self.linear_head_dim

    def tensors(self) -> list[TensorSpec]:
        """Every checkpoint tensor, in checkpoint order."""
        H, D = self.hidden_size, self.head_dim
        out = [TensorSpec("model.embed_tokens.weight", (self.vocab_size, H), EMBEDDING)]
        for i, lt in enumerate(self.layer_types):
            p = f"model.layers.{i}."
            out.append(TensorSpec(p + "input_layernorm.weight", (H,), NORM))
            if lt == "full_attention":
                q_rows = self.num_heads * D * (2 if self.attn_output_gate else 1)
                out += [TensorSpec(p + "self_attn.q_proj.weight", (q_rows, H), LINEAR),
                        TensorSpec(p + "self_attn.k_proj.weight", (self.num_kv_heads * D, H), LINEAR),
                        TensorSpec(p + "self_attn.v_proj.weight", (self.num_kv_heads * D, H), LINEAR),
                        TensorSpec(p + "self_attn.o_proj.weight", (H, self.num_heads * D), LINEAR)]
                if self.qk_norm:
                    out += [TensorSpec(p + "self_attn.q_norm.weight", (D,), NORM),
                            TensorSpec(p + "self_attn.k_norm.weight", (D,), NORM)]
            elif lt == "linear_attention":
                kd, vd, nv = self.linear_key_dim, self.linear_value_dim, self.linear_num_v_heads
                la = p + "linear_attn."
                out += [TensorSpec(la + "in_proj_qkv.weight", (2 * kd + vd, H), LINEAR),
                        TensorSpec(la + "in_proj_z.weight", (vd, H), LINEAR),
                        TensorSpec(la + "in_proj_b.weight", (nv, H), LINEAR),
                        TensorSpec(la + "in_proj_a.weight", (nv, H), LINEAR),
                        TensorSpec(la + "conv1d.weight", (2 * kd + vd, 1, self.linear_conv_kernel), CONV),
                        TensorSpec(la + "dt_bias", (nv,), PARAM),
                        TensorSpec(la + "A_log", (nv,), PARAM),
                        TensorSpec(la + "norm.weight", (self.linear_head_dim,), NORM),
                        TensorSpec(la + "out_proj.weight", (H, vd), LINEAR)]
            else:
                raise ModelError(f"model {self.name!r}: unknown layer type {lt!r}")
            out.append(TensorSpec(p + "post_attention_layernorm.weight", (H,), NORM))
            if self.is_moe:
                I, E = self.moe_intermediate_size, self.num_experts
                out.append(TensorSpec(p + "mlp.gate.weight", (E, H), LINEAR))
                for e in range(E):
                    out += [TensorSpec(p + f"mlp.experts.{e}.gate_proj.weight", (I, H), LINEAR),
                            TensorSpec(p + f"mlp.experts.{e}.up_proj.weight", (I, H), LINEAR),
                            TensorSpec(p + f"mlp.experts.{e}.down_proj.weight", (H, I), LINEAR)]
                if self.shared_expert_intermediate_size:
                    S = self.shared_expert_intermediate_size
                    out += [TensorSpec(p + "mlp.shared_expert.gate_proj.weight", (S, H), LINEAR),
                            TensorSpec(p + "mlp.shared_expert.up_proj.weight", (S, H), LINEAR),
                            TensorSpec(p + "mlp.shared_expert.down_proj.weight", (H, S), LINEAR),
                            TensorSpec(p + "mlp.shared_expert_gate.weight", (1, H), LINEAR)]
            else:
                I = self.intermediate_size
                out += [TensorSpec(p + "mlp.gate_proj.weight", (I, H), LINEAR),
                        TensorSpec(p + "mlp.up_proj.weight", (I, H), LINEAR),
                        TensorSpec(p + "mlp.down_proj.weight", (H, I), LINEAR)]
        out += [TensorSpec("model.norm.weight", (H,), NORM),
                TensorSpec("lm_head.weight", (self.vocab_size, H), EMBEDDING)]
        return out

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        for k in ("layer_types", "default_exclude", "engine_high_precision"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def tensor_map(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors()}

    def init_weights(self, seed: int = 0) -> dict[str, torch.Tensor]:
        """Random fp32 masters: GEMMs and embeddings ~ N(0, 0.05), norms ~ 1 + N(0, 0.1), A_log / dt_bias small."""
        g = torch.Generator().manual_seed(seed)
        out = {}
        for t in self.tensors():
            if t.kind == NORM:
                v = 1.0 + 0.1 * torch.randn(t.shape, generator=g)
            elif t.kind == PARAM:
                v = 0.5 * torch.randn(t.shape, generator=g)
            elif t.kind == CONV:
                v = 0.3 * torch.randn(t.shape, generator=g)
            else:
                v = 0.05 * torch.randn(t.shape, generator=g)    # logits ~ N(0, 1): a realistic temperature
            out[t.name] = v
        return out

    def hf_config(self, quantization_config: dict | None = None) -> dict:
        """HF config.json for the real engines (vLLM builds the model from it; weights come by sync)."""
        c = {"architectures": [self.architecture], "model_type": self.model_type,
             "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
             "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
             "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
             "intermediate_size": self.intermediate_size, "rms_norm_eps": self.rms_norm_eps,
             "rope_theta": self.rope_theta, "max_position_embeddings": 1024, "tie_word_embeddings": False,
             "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
             "torch_dtype": "bfloat16", "dtype": "bfloat16"}
        if self.is_moe:
            c.update(num_experts=self.num_experts, num_experts_per_tok=self.top_k,
                     moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[],
                     shared_expert_intermediate_size=self.shared_expert_intermediate_size)
        c.update(self.extra.get("hf_config", {}))
        if quantization_config is not None:
            c["quantization_config"] = quantization_config
        return c


MODELS: dict[str, ModelSpec] = {
    # Qwen3 style: q_norm / k_norm; MHA so q, k, v, o are all square [512, 512].
    "tiny-dense": ModelSpec(
        "tiny-dense", "Qwen3ForCausalLM", "qwen3", num_kv_heads=4,
        default_exclude=()),
    # Qwen3-MoE with a shared expert (vLLM's Qwen3MoeSparseMoeBlock builds one when
    # shared_expert_intermediate_size > 0): the router `mlp.gate` (out dim 8) must be in ignored_layers or vLLM
    # block-quantizes it (shared/gpu/README.md item 8); `shared_expert_gate` (out dim 1) is always BF16 in vLLM.
    # GQA: 4 heads, 2 kv heads.
    "tiny-moe": ModelSpec(
        "tiny-moe", "Qwen3MoeForCausalLM", "qwen3_moe", num_kv_heads=2,
        num_experts=8, top_k=2, moe_intermediate_size=256, shared_expert_intermediate_size=512,
        default_exclude=("mlp.gate", "mlp.shared_expert_gate"),
        engine_high_precision=("mlp.shared_expert_gate",)),
    # Qwen3.5 style hybrid (CPU reference only: vLLM 0.26 registers Qwen3.5 only as a multimodal model): a gated
    # delta-net layer, then a gated full-attention layer. vLLM needs in_proj_a / in_proj_b (out dim = v heads) in
    # BF16; Megatron-Core fuses the whole GDN input projection [q|k|v|z|b|a] into one `in_proj` GEMM, so the
    # trainer can only keep b/a in BF16 by keeping all of in_proj in BF16: the exclusion set must be closed under
    # the trainer's fusion (rule X3). conv1d, A_log, dt_bias are not GEMM weights.
    "tiny-hybrid": ModelSpec(
        "tiny-hybrid", "Qwen3_5ForCausalLM", "qwen3_5_text", num_kv_heads=2,
        layer_types=("linear_attention", "full_attention"), linear_num_k_heads=2, linear_num_v_heads=4,
        attn_output_gate=True, live=False,
        default_exclude=("linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
                         "linear_attn.in_proj_a", "linear_attn.in_proj_b")),
    # The end-to-end RL loop's learner (e2e/rl): a Qwen3-style dense model small enough to train on two CPU
    # cores in minutes, every GEMM dim still a multiple of 128 (2 heads of 128, q/k/v/o [256, 256], gate/up
    # [512, 256]: each weight spans several 128x128 blocks). Vocab 128: the digit task's tokens plus unused ones.
    "tiny-rl": ModelSpec(
        "tiny-rl", "Qwen3ForCausalLM", "qwen3", vocab_size=128, hidden_size=256, num_heads=2, num_kv_heads=2,
        intermediate_size=512),
}


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make a model (e.g. one read from a checkpoint's config.json) available by name to SyncConfig."""
    MODELS[spec.name] = spec
    return spec


def spec_from_hf_config(cfg, name: str) -> ModelSpec:
    """A ModelSpec with the dims of an HF config.json (Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen3-Next-style),
    for alignment and exclusion rules. Raises ModelError naming the key when a dim is missing or not a positive
    integer."""
    if not isinstance(cfg, dict):
        raise ModelError(f"{name}: config.json must be a mapping of keys, got {type(cfg).__name__}")
    cfg = cfg.get("text_config", cfg)
    if not isinstance(cfg, dict):
        raise ModelError(f"{name}: config.json text_config must be a mapping")

    def num(key, default=None, positive=True):
        v = cfg.get(key, default)
        if v is None and default is None:
            if key not in cfg:
                raise ModelError(f"{name}: config.json has no {key!r}")
            raise ModelError(f"{name}: config.json {key} is null, expected a positive integer")
        if isinstance(v, bool) or not isinstance(v, int) or (positive and v <= 0) or v < 0:
            raise ModelError(f"{name}: config.json {key} = {v!r}, expected a {'positive' if positive else 'non-negative'} "
                             f"integer")
        return v

    def real(key, default):
        v = cfg.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ModelError(f"{name}: config.json {key} = {v!r}, expected a positive number")
        return float(v)
    H, heads = num("hidden_size"), num("num_attention_heads")
    n_layers = num("num_hidden_layers")
    head_dim = cfg.get("head_dim") or None
    if head_dim is None:
        if H % heads:
            raise ModelError(f"{name}: config.json hidden_size {H} is not a multiple of num_attention_heads {heads} "
                             f"and head_dim is not given")
        head_dim = H // heads
    elif isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelError(f"{name}: config.json head_dim = {head_dim!r}, expected a positive integer")
    kw = dict(vocab_size=num("vocab_size", 32000), hidden_size=H, num_layers=n_layers, num_heads=heads,
              num_kv_heads=num("num_key_value_heads", heads), head_dim=head_dim,
              intermediate_size=num("intermediate_size", 4 * H),
              qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"), rms_norm_eps=real("rms_norm_eps", 1e-6),
              rope_theta=real("rope_theta", 10000.0))
    excl: list[str] = []
    experts = num("num_experts", 0, positive=False) or num("num_local_experts", 0, positive=False)
    if experts:
        kw.update(num_experts=experts, top_k=num("num_experts_per_tok", 2),
                  moe_intermediate_size=num("moe_intermediate_size", kw["intermediate_size"]),
                  shared_expert_intermediate_size=num("shared_expert_intermediate_size", 0, positive=False))
        excl += ["mlp.gate"] + (["mlp.shared_expert_gate"] if kw["shared_expert_intermediate_size"] else [])
    lt = cfg.get("layer_types")
    if lt:
        if not isinstance(lt, list) or not all(isinstance(x, str) for x in lt):
            raise ModelError(f"{name}: config.json layer_types must be a list of strings")
        lt = tuple(lt)
        if "linear_attention" in lt:
            kd, vd = num("linear_key_head_dim", 128), num("linear_value_head_dim", 128)
            if kd != vd:
                raise ModelError(f"{name}: linear_key_head_dim {kd} != linear_value_head_dim {vd} is not modelled")
            kw.update(layer_types=lt, linear_num_k_heads=num("linear_num_key_heads", 16),
                      linear_num_v_heads=num("linear_num_value_heads", 32), linear_head_dim=kd,
                      linear_conv_kernel=num("linear_conv_kernel_dim", 4))
            excl += ["linear_attn.in_proj_a", "linear_attn.in_proj_b"]
        kw["attn_output_gate"] = bool(cfg.get("attn_output_gate", "linear_attention" in lt))
    archs = cfg.get("architectures") or ["unknown"]
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "unknown"
    try:
        return ModelSpec(name, arch, str(cfg.get("model_type", "unknown")), default_exclude=tuple(excl), live=False, **kw)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{name}: {e}") from None


def get_model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]
