"""Models: shapes, names and roles of every tensor, built in code or read from a Hugging Face config.json (no
downloads, no checkpoint weights: the weights are random, deterministic from the seed).

`get_model(name)` resolves, in this order: a registered name (the embedded tiny models, or one registered
before); `NAME@<N>L` (NAME cut to its first N layers, every per-layer shape unchanged: `with_layers`); a shipped
config (`harness/model_configs/<name>.json`, the public shapes of real models: `SHIPPED`); a path to a config.json
or to a checkpoint directory holding one. Each resolved spec is registered under the name asked for.

Names are the HF checkpoint names the trainer exports and vLLM's loaders accept. In the tiny models every GEMM
dim is a multiple of 128 (one 128x128 block row per attention head), so fused tensors split on block boundaries,
and shapes are chosen so that layout faults cannot hide behind shape checks: q, k, v, o are all [512, 512] in
tiny-dense (a square projection and q/k of equal size), gate and up share a shape everywhere.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # shapes and names need no torch: pre-flight reads models without importing it
    import torch

from .errors import ModelError  # noqa: F401 - raised here, defined with the other input errors


# kind of a tensor: decides whether the FP8 recipe can apply to it at all
LINEAR = "linear"          # GEMM weight [out, in]: quantizable unless excluded
EMBEDDING = "embedding"    # vocab-parallel embedding / lm head: never quantized by the fp8 method
NORM = "norm"
CONV = "conv"
PARAM = "param"            # other plain parameters (A_log, dt_bias)

# random masters per tensor kind: (mean, std). GEMMs and embeddings ~ N(0, 0.05) (logits ~ N(0, 1): a realistic
# temperature), norms ~ 1 + N(0, 0.1), A_log / dt_bias and the GDN conv small
INIT = {LINEAR: (0.0, 0.05), EMBEDDING: (0.0, 0.05), NORM: (1.0, 0.1), PARAM: (0.0, 0.5), CONV: (0.0, 0.3)}

# How vLLM 0.26 serves a Qwen3.5 checkpoint. Its registry has the conditional-generation classes only
# (model_executor/models/registry.py:573-577), which nest the text config under `text_config` (model_type
# qwen3_5 / qwen3_5_moe, transformers_utils/configs/qwen3_5*.py) and name the language model's checkpoint tensors
# `model.language_model.*` (the released checkpoints' names; the class's hf_to_vllm_mapper,
# model_executor/models/qwen3_vl.py:1705-1711). A spec of a Qwen3.5 text model (its text config's model_type) is
# served in that form: text model_type -> (registered architecture, top-level model_type).
SERVED_AS = {"qwen3_5_text": ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
             "qwen3_5_moe_text": ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")}
MULTIMODAL = {arch: top for arch, top in SERVED_AS.values()}     # wrapper architecture -> its top model_type
LM_PREFIX = "model"                      # checkpoint prefix of a text model's language model
WRAPPED_LM_PREFIX = "model.language_model"
# the vision tower a wrapper's config.json must carry (Qwen3_5VisionConfig's fields): never served -- fp8check's
# engines start with every modality's limit 0, so vLLM builds the tower on the meta device and registers it
# nowhere (model_executor/models/interfaces.py:257-296, utils.py:687-778) -- but built: every dim a multiple of
# 128, so a block-FP8 quant config accepts its linears; out_hidden_size is the text model's hidden size
VISION_CONFIG = {"depth": 1, "hidden_size": 128, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 256,
                 "num_heads": 1, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                 "temporal_patch_size": 2, "num_position_embeddings": 64}
# text model types whose RMSNorms scale by 1 + weight (vLLM builds them as GemmaRMSNorm: qwen3_next.py:28,
# qwen3_5.py:38), except the gated delta-net's output norm (RMSNormGated: weight as is)
ZERO_CENTERED_NORMS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

# how a model's random masters are drawn (harness.engines.cpu.masters):
SEQUENTIAL = "sequential"  # one generator through every tensor in checkpoint order: the embedded tiny models (their
#                            recorded GPU results and fault evidence refer to these exact values)
PER_TENSOR = "per-tensor"  # each tensor from its own seed, generated when read: real shapes, one tensor at a time
WEIGHT_INITS = (SEQUENTIAL, PER_TENSOR)


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
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = False  # lm_head is embed_tokens: the checkpoint (and the sync) has no lm_head.weight
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
    partial_rotary_factor: float = 1.0  # rotary embedding on the first head_dim * factor dims of q and k
    # RMSNorm weights are zero-centered: the norm scales by 1 + weight (Qwen3.5 / Qwen3-Next, Megatron's
    # layernorm_zero_centered_gamma); the gated delta-net's output norm scales by its weight either way
    zero_centered_norms: bool = False
    # tensors kept in high precision by default (module-name patterns, see harness.config)
    default_exclude: tuple[str, ...] = ()
    # modules the vLLM model class builds without a quant config, whatever ignored_layers says
    engine_high_precision: tuple[str, ...] = ()
    # parameters (name patterns) the vLLM model class holds in float32 whatever the checkpoint dtype (the gated
    # delta-net's A_log: layers/mamba/gdn/qwen_gdn_linear_attn.py:445-450); the wire carries BF16 like every
    # high-precision tensor, the engine's copy is its exact float32 value
    engine_fp32: tuple[str, ...] = ()
    # checkpoint prefix of the language model: `model` (text models), `model.language_model` (a multimodal
    # wrapper's checkpoint, e.g. Qwen3.5); "" derives it from the architecture
    lm_prefix: str = ""
    live: bool = True                  # served by vLLM 0.26 on the GPU machine (else CPU reference only)
    weight_init: str = SEQUENTIAL
    # config.json features the tensor set does not model, as (key, why): the dims still feed pre-flight's shape
    # rules, but no sync can run on such a spec (`require_modelled`)
    unmodelled: tuple[tuple[str, str], ...] = ()
    source: str = ""                   # the config.json a spec was read from ("" for built-in specs)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.model_type in SERVED_AS:          # the form vLLM 0.26 serves (SERVED_AS)
            object.__setattr__(self, "architecture", SERVED_AS[self.model_type][0])
        # what vLLM's classes for these model types hold whatever the spec says (any Qwen3.5 spec, built here or
        # by hand, is served so): GemmaRMSNorm, the GDN's float32 A_log, a router built without a quant config
        if self.model_type in ZERO_CENTERED_NORMS:
            object.__setattr__(self, "zero_centered_norms", True)
            if self.num_experts and "mlp.gate" not in self.engine_high_precision:
                object.__setattr__(self, "engine_high_precision", tuple(self.engine_high_precision) + ("mlp.gate",))
        if self.model_type in SERVED_AS and "linear_attention" in self.layer_types and not self.engine_fp32:
            object.__setattr__(self, "engine_fp32", ("linear_attn.A_log",))
        if not self.lm_prefix:
            object.__setattr__(self, "lm_prefix", WRAPPED_LM_PREFIX if self.architecture in MULTIMODAL else LM_PREFIX)
        if self.weight_init not in WEIGHT_INITS:
            raise ModelError(f"model {self.name!r}: weight_init {self.weight_init!r} is not one of {WEIGHT_INITS}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelError(f"model {self.name!r}: {len(self.layer_types)} layer_types for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"model {self.name!r}: num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def require_modelled(self) -> None:
        """Raise ModelError (naming the config file and key) when the spec has features no sync can model."""
        if self.unmodelled:
            key, why = self.unmodelled[0]
            raise ModelError(f"{self.source or self.name}: {key}: {why}; the reference engines cannot sync this "
                             f"model (pre-flight's shape rules still read its dims)")

    # -- checkpoint names outside the per-layer tensors ----------------------------------------------------------
    def layer_prefix(self, i: int) -> str:
        """`model.layers.3.` (a wrapper: `model.language_model.layers.3.`)."""
        return f"{self.lm_prefix}.layers.{i}."

    @property
    def embed_name(self) -> str:
        return f"{self.lm_prefix}.embed_tokens.weight"

    @property
    def final_norm_name(self) -> str:
        return f"{self.lm_prefix}.norm.weight"

    @property
    def head_name(self) -> str:
        """The logits' weight: the lm head, or the embedding when they are tied."""
        return self.embed_name if self.tie_word_embeddings else "lm_head.weight"

    def layer_of(self, name: str) -> int | None:
        """The layer index of a checkpoint name, None outside the layers."""
        pre = self.lm_prefix + ".layers."
        if not name.startswith(pre):
            return None
        head = name[len(pre):].split(".", 1)[0]
        return int(head) if head.isdigit() else None

    @property
    def rotary_dim(self) -> int:
        """Dims of each q / k head the rotary embedding turns (vLLM's get_rope: int(head_dim * factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_k_heads * self.linear_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_v_heads * self.linear_head_dim

    def tensors(self) -> list[TensorSpec]:
        """Every checkpoint tensor, in checkpoint order (built once per spec: a full Qwen3-30B-A3B has 18k)."""
        cached = self.__dict__.get("_tensors")
        if cached is None:
            cached = tuple(self._build_tensors())
            object.__setattr__(self, "_tensors", cached)        # frozen dataclass: a cache, not a field
        return list(cached)

    def _build_tensors(self) -> list[TensorSpec]:
        H, D = self.hidden_size, self.head_dim
        out = [TensorSpec(self.embed_name, (self.vocab_size, H), EMBEDDING)]
        for i, lt in enumerate(self.layer_types):
            p = self.layer_prefix(i)
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
        out.append(TensorSpec(self.final_norm_name, (H,), NORM))
        if not self.tie_word_embeddings:
            out.append(TensorSpec("lm_head.weight", (self.vocab_size, H), EMBEDDING))
        return out

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        for k in ("layer_types", "default_exclude", "engine_high_precision", "engine_fp32"):
            if k in d:
                d[k] = tuple(d[k])
        if "unmodelled" in d:
            d["unmodelled"] = tuple(tuple(x) for x in d["unmodelled"])
        return cls(**d)

    def tensor_map(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors()}

    def num_params(self) -> int:
        n = 0
        for t in self.tensors():
            k = 1
            for d in t.shape:
                k *= d
            n += k
        return n

    def init_weights(self, seed: int = 0) -> dict[str, torch.Tensor]:
        """Random fp32 masters, one generator through every tensor (the `sequential` scheme; the per-tensor one
        is harness.engines.cpu.masters): GEMMs and embeddings ~ N(0, 0.05), norms ~ 1 + N(0, 0.1), A_log / dt_bias
        small."""
        import torch
        g = torch.Generator().manual_seed(seed)
        out = {}
        for t in self.tensors():
            mean, std = INIT[t.kind]
            v = std * torch.randn(t.shape, generator=g)
            out[t.name] = mean + v if mean else v
        return out

    def hf_config(self, quantization_config: dict | None = None) -> dict:
        """HF config.json for the real engines (vLLM builds the model from it; weights come by sync). A multimodal
        wrapper's (`MULTIMODAL`) nests the text model under `text_config` beside a minimal `vision_config`
        (`VISION_CONFIG`), as the released checkpoints do; `quantization_config` stays at the top."""
        c = {"architectures": [self.architecture], "model_type": self.model_type,
             "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
             "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
             "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
             "intermediate_size": self.intermediate_size, "rms_norm_eps": self.rms_norm_eps,
             "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
             "tie_word_embeddings": self.tie_word_embeddings,
             "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
             "torch_dtype": "bfloat16", "dtype": "bfloat16"}
        if self.is_moe:
            c.update(num_experts=self.num_experts, num_experts_per_tok=self.top_k,
                     moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[],
                     shared_expert_intermediate_size=self.shared_expert_intermediate_size)
        if "linear_attention" in self.layer_types:
            c.update(layer_types=list(self.layer_types), linear_num_key_heads=self.linear_num_k_heads,
                     linear_num_value_heads=self.linear_num_v_heads, linear_key_head_dim=self.linear_head_dim,
                     linear_value_head_dim=self.linear_head_dim, linear_conv_kernel_dim=self.linear_conv_kernel)
        if self.attn_output_gate:
            c["attn_output_gate"] = True
        if self.architecture in MULTIMODAL or self.partial_rotary_factor != 1.0:
            c["partial_rotary_factor"] = self.partial_rotary_factor
            c["rope_parameters"] = self.rope_parameters()
        c.update(self.extra.get("hf_config", {}))
        if self.architecture in MULTIMODAL:
            # the recurrent state in float32, as the released Qwen3.5-35B-A3B config asks (vLLM reads it into
            # mamba_ssm_cache_dtype: models/config.py:744-768) and the reference forward keeps it
            text = {"mamba_ssm_dtype": "float32", **{k: v for k, v in c.items() if k != "architectures"}}
            c = {"architectures": [self.architecture], "model_type": MULTIMODAL[self.architecture],
                 "text_config": text, "vision_config": {**VISION_CONFIG, "out_hidden_size": self.hidden_size},
                 "tie_word_embeddings": self.tie_word_embeddings, "torch_dtype": "bfloat16", "dtype": "bfloat16"}
        if quantization_config is not None:
            c["quantization_config"] = quantization_config
        return c

    def rope_parameters(self) -> dict:
        """The text config's `rope_parameters`: the source config's where it had them, else plain RoPE on
        `rotary_dim` dims; a multimodal wrapper's with the interleaved multimodal sections its class expects (T, H,
        W positions: on text, all three are the token's position, so the rotation is plain RoPE's)."""
        if "rope_parameters" in self.extra:
            return dict(self.extra["rope_parameters"])
        r = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.partial_rotary_factor != 1.0:
            r["partial_rotary_factor"] = self.partial_rotary_factor
        if self.architecture in MULTIMODAL:
            half = self.rotary_dim // 2           # the sections split the rotated half-dims (11, 11, 10 of 32)
            t = -(-half // 3)
            r.update(mrope_section=[t, t, half - 2 * t], mrope_interleaved=True)
        return r


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
    # Qwen3.5-style hybrid, as vLLM 0.26 serves Qwen3.5 (SERVED_AS: Qwen3_5ForConditionalGeneration, checkpoint
    # names `model.language_model.*`): a gated delta-net layer, then a gated full-attention layer (q_proj holds a
    # sigmoid gate per head; RoPE on a quarter of each head), zero-centered RMSNorms. vLLM needs in_proj_a /
    # in_proj_b (out dim = v heads) in BF16 ("ba_proj doesn't support blockwise fp8 quantization"); Megatron-Core
    # fuses the whole GDN input projection [q|k|v|z|b|a] into one `in_proj` GEMM, so the trainer can only keep
    # b/a in BF16 by keeping all of in_proj in BF16: the exclusion set must be closed under the trainer's fusion
    # (rule X3). conv1d, A_log, dt_bias are not GEMM weights; vLLM holds A_log in float32.
    "tiny-hybrid": ModelSpec(
        "tiny-hybrid", "Qwen3_5ForConditionalGeneration", "qwen3_5_text", num_kv_heads=2,
        layer_types=("linear_attention", "full_attention"), linear_num_k_heads=2, linear_num_v_heads=4,
        attn_output_gate=True, partial_rotary_factor=0.25,
        default_exclude=("linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
                         "linear_attn.in_proj_a", "linear_attn.in_proj_b")),
    # Qwen3.5-MoE style hybrid, shaped as Qwen3.5-35B-A3B is (served as Qwen3_5MoeForConditionalGeneration): a gated delta-net
    # layer then a gated full-attention layer, each with a routed-expert MLP (8 experts, top-2) and a shared expert
    # behind its sigmoid gate. vLLM's Qwen3.5 MoE block (Qwen3NextSparseMoeBlock) builds the router `mlp.gate` and
    # `mlp.shared_expert_gate` with quant_config=None (models/qwen3_next.py:140-154), so both are BF16 everywhere.
    "tiny-hybrid-moe": ModelSpec(
        "tiny-hybrid-moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text", num_kv_heads=2,
        layer_types=("linear_attention", "full_attention"), linear_num_k_heads=2, linear_num_v_heads=4,
        attn_output_gate=True, partial_rotary_factor=0.25, num_experts=8, top_k=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        default_exclude=("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_a",
                         "linear_attn.in_proj_b", "mlp.gate", "mlp.shared_expert_gate"),
        engine_high_precision=("mlp.gate", "mlp.shared_expert_gate")),
    # The end-to-end RL loop's learner (e2e/rl): a Qwen3-style dense model small enough to train on two CPU
    # cores in minutes, every GEMM dim still a multiple of 128 (2 heads of 128, q/k/v/o [256, 256], gate/up
    # [512, 256]: each weight spans several 128x128 blocks). Vocab 128: the digit task's tokens plus unused ones.
    "tiny-rl": ModelSpec(
        "tiny-rl", "Qwen3ForCausalLM", "qwen3", vocab_size=128, hidden_size=256, num_heads=2, num_kv_heads=2,
        intermediate_size=512),
}
BUILTIN = tuple(MODELS)      # the embedded tiny models


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make a model (e.g. one read from a checkpoint's config.json) available by name to SyncConfig."""
    MODELS[spec.name] = spec
    return spec


# -- Hugging Face config.json -> ModelSpec ----------------------------------------------------------------------------
# architectures whose checkpoint names, fusions and post-load the layouts model and vLLM 0.26 serves as text models
LIVE_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM", *MULTIMODAL)
MODEL_CONFIGS = "model_configs"       # shipped configs, package data of `harness`


def spec_from_hf_config(cfg, name: str, source: str | None = None) -> ModelSpec:
    """A ModelSpec with the dims of an HF config.json (Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen3-Next-style; a
    multimodal wrapper's text model from its `text_config`, e.g. Qwen3.5 and Qwen3.5-MoE).

    Raises ModelError naming `source` (the file; default `name`) and the key when a value is missing or of the
    wrong type. Features the tensor set does not model (attention or MLP biases, dense layers inside a MoE model,
    Qwen2's q/k/v biases) are recorded in `unmodelled`: pre-flight's shape rules still run on the dims, a sync
    refuses (`ModelSpec.require_modelled`). Real-shape specs draw their masters per tensor (`PER_TENSOR`)."""
    src = source or name
    if not isinstance(cfg, dict):
        raise ModelError(f"{src}: config.json must be a mapping of keys, got {type(cfg).__name__}")
    top, cfg = cfg, cfg.get("text_config", cfg)
    if not isinstance(cfg, dict):
        raise ModelError(f"{src}: config.json text_config must be a mapping")

    def num(key, default=None, positive=True):
        v = cfg.get(key, default)
        if v is None and default is None:
            if key not in cfg:
                raise ModelError(f"{src}: config.json has no {key!r}")
            raise ModelError(f"{src}: config.json {key} is null, expected a positive integer")
        if isinstance(v, bool) or not isinstance(v, int) or (positive and v <= 0) or v < 0:
            raise ModelError(f"{src}: config.json {key} = {v!r}, expected a {'positive' if positive else 'non-negative'} "
                             f"integer")
        return v

    def real(key, default):
        v = cfg.get(key, default)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ModelError(f"{src}: config.json {key} = {v!r}, expected a positive number")
        return float(v)

    def flag(key, default=False):
        v = cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ModelError(f"{src}: config.json {key} = {v!r}, expected true or false")
        return v

    H, heads = num("hidden_size"), num("num_attention_heads")
    n_layers = num("num_hidden_layers")
    head_dim = cfg.get("head_dim") or None
    if head_dim is None:
        if H % heads:
            raise ModelError(f"{src}: config.json hidden_size {H} is not a multiple of num_attention_heads {heads} "
                             f"and head_dim is not given")
        head_dim = H // heads
    elif isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelError(f"{src}: config.json head_dim = {head_dim!r}, expected a positive integer")
    model_type = cfg.get("model_type", "unknown")
    if not isinstance(model_type, str):
        raise ModelError(f"{src}: config.json model_type = {model_type!r}, expected a string")
    # RoPE: transformers v5 keeps theta (and a partial rotary factor) in `rope_parameters`, v4 at the top level
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if rope is not None and not isinstance(rope, dict):
        raise ModelError(f"{src}: config.json rope_parameters = {rope!r}, expected a mapping")
    rope = rope or {}

    def rope_value(key, default):
        v = cfg.get(key)
        return rope.get(key, default) if v is None else v
    theta, factor = rope_value("rope_theta", 10000.0), rope_value("partial_rotary_factor", 1.0)
    for key, v in (("rope_theta", theta), ("partial_rotary_factor", factor)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or (key != "rope_theta" and v > 1):
            raise ModelError(f"{src}: config.json {key} = {v!r}, expected a positive number"
                             + (" of at most 1" if key != "rope_theta" else ""))
    kw = dict(vocab_size=num("vocab_size", 32000), hidden_size=H, num_layers=n_layers, num_heads=heads,
              num_kv_heads=num("num_key_value_heads", heads), head_dim=head_dim,
              intermediate_size=num("intermediate_size", 4 * H), qk_norm=model_type.startswith("qwen3"),
              rms_norm_eps=real("rms_norm_eps", 1e-6), rope_theta=float(theta), partial_rotary_factor=float(factor),
              max_position_embeddings=num("max_position_embeddings", 4096),
              tie_word_embeddings=flag("tie_word_embeddings", top.get("tie_word_embeddings", False) is True),
              zero_centered_norms=model_type in ZERO_CENTERED_NORMS)
    unmodelled: list[tuple[str, str]] = []
    for key in ("attention_bias", "mlp_bias"):
        if flag(key):
            unmodelled.append((key, "bias tensors are not modelled (every linear here is bias-free)"))
    if model_type == "qwen2" or model_type == "qwen2_moe":
        unmodelled.append(("model_type", f"{model_type} has q/k/v biases, which are not modelled"))
    excl: list[str] = []
    hp: list[str] = []
    experts = num("num_experts", 0, positive=False) or num("num_local_experts", 0, positive=False)
    if experts:
        kw.update(num_experts=experts, top_k=num("num_experts_per_tok", 2),
                  moe_intermediate_size=num("moe_intermediate_size", kw["intermediate_size"]),
                  shared_expert_intermediate_size=num("shared_expert_intermediate_size", 0, positive=False))
        excl += ["mlp.gate"]
        if model_type in ZERO_CENTERED_NORMS:
            hp.append("mlp.gate")                   # Qwen3NextSparseMoeBlock builds its router without a quant config
        if kw["shared_expert_intermediate_size"]:
            excl.append("mlp.shared_expert_gate")
            hp.append("mlp.shared_expert_gate")     # vLLM builds it without a quant config
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in only):
            raise ModelError(f"{src}: config.json mlp_only_layers = {only!r}, expected a list of layer indices")
        if only:
            unmodelled.append(("mlp_only_layers", f"dense MLP layers {only[:4]} inside a MoE model are not modelled "
                                                  f"(every layer here is MoE)"))
        step = num("decoder_sparse_step", 1)
        if step != 1:
            unmodelled.append(("decoder_sparse_step", f"{step}: a MoE layer every {step} layers is not modelled "
                                                      f"(every layer here is MoE)"))
    lt = cfg.get("layer_types")
    if not lt and model_type in SERVED_AS:
        # Qwen3_5TextConfig's default: every full_attention_interval-th layer full attention
        every = num("full_attention_interval", 4)
        lt = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layers)]
    engine_fp32: tuple[str, ...] = ()
    if lt:
        if not isinstance(lt, list) or not all(isinstance(x, str) for x in lt):
            raise ModelError(f"{src}: config.json layer_types must be a list of strings")
        lt = tuple(lt)
        if "linear_attention" in lt:
            kd, vd = num("linear_key_head_dim", 128), num("linear_value_head_dim", 128)
            if kd != vd:
                raise ModelError(f"{src}: linear_key_head_dim {kd} != linear_value_head_dim {vd} is not modelled")
            kw.update(layer_types=lt, linear_num_k_heads=num("linear_num_key_heads", 16),
                      linear_num_v_heads=num("linear_num_value_heads", 32), linear_head_dim=kd,
                      linear_conv_kernel=num("linear_conv_kernel_dim", 4))
            # vLLM needs b / a in BF16 (its in_proj_ba takes no block scales) and Megatron-Core quantizes the fused
            # in_proj [q|k|v|z|b|a] whole: the one exclusion closed under both fusions is all of in_proj (X2, X3)
            excl += ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_a",
                     "linear_attn.in_proj_b"]
            engine_fp32 = ("linear_attn.A_log",)
        kw["attn_output_gate"] = flag("attn_output_gate", "linear_attention" in lt)
    archs = top.get("architectures") or cfg.get("architectures") or ["unknown"]
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "unknown"
    if model_type in SERVED_AS:
        arch = SERVED_AS[model_type][0]
    # text positions make multimodal RoPE sections plain RoPE (all three positions are the token's)
    plain_rope = rope.get("rope_type", rope.get("type", "default")) == "default"
    # served live only where the layouts mirror vLLM's loader and the reference forward mirrors the model
    live = arch in LIVE_ARCHITECTURES and not unmodelled and plain_rope and (
        "linear_attention" not in kw.get("layer_types", ()) or arch in MULTIMODAL)
    extra = {"rope_parameters": dict(rope)} if cfg.get("rope_parameters") else {}
    try:
        return ModelSpec(name, arch, model_type, default_exclude=tuple(excl), engine_high_precision=tuple(hp),
                         engine_fp32=engine_fp32, live=live, weight_init=PER_TENSOR, unmodelled=tuple(unmodelled),
                         source=src, extra=extra, **kw)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{src}: {e}") from None


def read_hf_config(path: str) -> tuple[dict, str]:
    """(config.json content, the file it came from) for a config.json path or a checkpoint directory."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(cfg_path):
        where = f"{path} has no config.json" if os.path.isdir(path) else f"{path}: no such file"
        raise ModelError(f"{where}; --model takes a built-in model ({', '.join(_builtin_names())}), a shipped "
                         f"config ({', '.join(SHIPPED)}), or a path to a config.json / checkpoint directory")
    try:
        with open(cfg_path, "rb") as f:
            return json.loads(f.read().decode("utf-8")), cfg_path
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{cfg_path}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    except OSError as e:
        raise ModelError(f"{cfg_path}: cannot be read ({e.strerror or e.__class__.__name__})") from None


def _shipped() -> tuple[str, ...]:
    root = resources.files("fp8check.harness") / MODEL_CONFIGS
    try:
        return tuple(sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json")))
    except (FileNotFoundError, NotADirectoryError):
        return ()


SHIPPED: tuple[str, ...] = _shipped()   # shipped config names (the public shapes of real models)


def shipped_config(name: str) -> dict:
    """The shipped config.json of a real model (`SHIPPED`), as a mapping."""
    if name not in SHIPPED:
        raise ModelError(f"no shipped config {name!r}; shipped: {', '.join(SHIPPED)}")
    return json.loads((resources.files("fp8check.harness") / MODEL_CONFIGS / f"{name}.json").read_text())


_CUT = re.compile(r"^(?P<base>.+)@(?P<layers>\d+)L$")


def layers_name(name: str, layers: int) -> str:
    """The registered name of a model cut to its first `layers` layers."""
    return f"{name}@{layers}L"


def cut_layers(spec: ModelSpec, layers: int, name: str | None = None) -> ModelSpec:
    """`spec` with only its first `layers` layers: every per-layer shape, the vocabulary and the embeddings kept."""
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= spec.num_layers:
        raise ModelError(f"--layers {layers}: {spec.name} has {spec.num_layers} layer(s); give 1 to {spec.num_layers}")
    return replace(spec, name=name or layers_name(spec.name, layers), num_layers=layers,
                   layer_types=tuple(spec.layer_types[:layers]))


def with_layers(name: str, layers: int | None) -> str:
    """The registered name of model `name` cut to `layers` layers (`name@<layers>L`); `name` itself when layers is
    None or the full depth."""
    spec = get_model(name)
    if layers is None or layers == spec.num_layers and "@" not in name:
        cut_layers(spec, spec.num_layers if layers is None else layers)      # validates the count
        return name
    base = _CUT.match(name)
    root = get_model(base["base"]) if base else spec
    return get_model(layers_name(root.name, layers)).name


def _builtin_names() -> list[str]:
    return [n for n in MODELS if n in BUILTIN]


def get_model(name: str) -> ModelSpec:
    """A registered model, a cut `NAME@<N>L`, a shipped config name, or a path to a config.json / checkpoint
    directory (resolved once, then registered under `name`). ModelError names the file and key when it fails."""
    if not isinstance(name, str) or not name:
        raise ModelError(f"model must be a name or a path, got {name!r}")
    if name in MODELS:
        return MODELS[name]
    cut = _CUT.match(name)
    if cut:
        base = get_model(cut["base"])
        return register_model(cut_layers(base, int(cut["layers"]), name))
    if name in SHIPPED:
        return register_model(spec_from_hf_config(shipped_config(name), name, f"harness/{MODEL_CONFIGS}/{name}.json"))
    if os.sep in name or name.endswith(".json") or os.path.exists(name):
        cfg, cfg_path = read_hf_config(name)
        return register_model(spec_from_hf_config(cfg, name, cfg_path))
    raise ModelError(f"unknown model {name!r}; choose a built-in model ({', '.join(_builtin_names())}), a shipped "
                     f"config ({', '.join(SHIPPED)}), NAME@<N>L (the first N layers), or a path to a config.json / "
                     f"checkpoint directory")
