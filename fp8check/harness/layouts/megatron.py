"""Megatron-Core (Transformer Engine layer spec) parameter names -> HF checkpoint names.

`linear_qkv` interleaves per query group: for each KV group g, the rows of its query heads, then its key head,
then its value head (megatron/core/transformer/attention.py, `get_query_key_value_tensors`). `linear_fc1` is
[gate; up]. The pre-attention / pre-MLP RMSNorms are fused into `linear_qkv.layer_norm_weight` and
`linear_fc1.layer_norm_weight` (dense) or `pre_mlp_layernorm` (MoE). The trainer quantizes these fused tensors
as one [N, K] weight each, so exporting them to HF names moves whole 128-row blocks with their scales.
"""
from __future__ import annotations

from functools import lru_cache

from ..models import ModelSpec
from .pieces import Piece


def megatron_pieces(spec: ModelSpec) -> tuple[list[Piece], dict[str, tuple]]:
    """Pieces from Megatron tensors (src) to HF tensors (dst), and the Megatron tensor shapes (fresh containers of
    shared, frozen pieces: built once per spec)."""
    pieces, shapes = _megatron_pieces(spec)
    return list(pieces), dict(shapes)


@lru_cache(maxsize=32)
def _megatron_pieces(spec: ModelSpec) -> tuple[tuple[Piece, ...], dict[str, tuple]]:
    hf = spec.tensor_map()
    pieces: list[Piece] = []
    shapes: dict[str, tuple] = {}

    def whole(src: str, dst: str):
        shapes[src] = hf[dst].shape
        pieces.append(Piece(src, dst, 0, 0, hf[dst].shape[0]))

    def stack(src: str, parts: list[tuple[str, int, int]]):
        """parts: (hf name, hf row start, rows) in Megatron row order."""
        row = 0
        for dst, r0, n in parts:
            pieces.append(Piece(src, dst, row, r0, n))
            row += n
        shapes[src] = (row, hf[parts[0][0]].shape[1])

    whole("embedding.word_embeddings.weight", spec.embed_name)
    D = spec.head_dim
    for i, lt in enumerate(spec.layer_types):
        m, h = f"decoder.layers.{i}.", spec.layer_prefix(i)
        if lt == "full_attention":
            a, s = m + "self_attention.", h + "self_attn."
            whole(a + "linear_qkv.layer_norm_weight", h + "input_layernorm.weight")
            hpg = spec.num_heads // spec.num_kv_heads
            parts = []
            for g in range(spec.num_kv_heads):
                if spec.attn_output_gate:
                    # Megatron: [q heads, gate heads, k, v] per group; HF q_proj: [q_h; gate_h] per head
                    heads = range(g * hpg, (g + 1) * hpg)
                    parts += [(s + "q_proj.weight", h * 2 * D, D) for h in heads]
                    parts += [(s + "q_proj.weight", h * 2 * D + D, D) for h in heads]
                else:
                    parts.append((s + "q_proj.weight", g * hpg * D, hpg * D))
                parts.append((s + "k_proj.weight", g * D, D))
                parts.append((s + "v_proj.weight", g * D, D))
            stack(a + "linear_qkv.weight", parts)
            whole(a + "linear_proj.weight", s + "o_proj.weight")
            if spec.qk_norm:
                whole(a + "q_layernorm.weight", s + "q_norm.weight")
                whole(a + "k_layernorm.weight", s + "k_norm.weight")
        else:       # gated delta-net (megatron/core/ssm/gated_delta_net.py): in_proj rows [q|k|v|z|b|a]
            a, la = m + "self_attention.", h + "linear_attn."
            whole(a + "in_proj.layer_norm_weight", h + "input_layernorm.weight")
            stack(a + "in_proj.weight", [(la + n + ".weight", 0, hf[la + n + ".weight"].shape[0])
                                         for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")])
            for src, dst in (("conv1d.weight", "conv1d.weight"), ("dt_bias", "dt_bias"), ("A_log", "A_log"),
                             ("out_norm.weight", "norm.weight"), ("out_proj.weight", "out_proj.weight")):
                whole(a + src, la + dst)
        if spec.is_moe:
            whole(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight")
            whole(m + "mlp.router.weight", h + "mlp.gate.weight")
            I = spec.moe_intermediate_size
            for e in range(spec.num_experts):
                x = h + f"mlp.experts.{e}."
                stack(m + f"mlp.experts.linear_fc1.weight{e}", [(x + "gate_proj.weight", 0, I), (x + "up_proj.weight", 0, I)])
                whole(m + f"mlp.experts.linear_fc2.weight{e}", x + "down_proj.weight")
            if spec.shared_expert_intermediate_size:
                S, x = spec.shared_expert_intermediate_size, h + "mlp.shared_expert."
                stack(m + "mlp.shared_experts.linear_fc1.weight", [(x + "gate_proj.weight", 0, S), (x + "up_proj.weight", 0, S)])
                whole(m + "mlp.shared_experts.linear_fc2.weight", x + "down_proj.weight")
                whole(m + "mlp.shared_experts.gate_weight", h + "mlp.shared_expert_gate.weight")
        else:
            I = spec.intermediate_size
            whole(m + "mlp.linear_fc1.layer_norm_weight", h + "post_attention_layernorm.weight")
            stack(m + "mlp.linear_fc1.weight", [(h + "mlp.gate_proj.weight", 0, I), (h + "mlp.up_proj.weight", 0, I)])
            whole(m + "mlp.linear_fc2.weight", h + "mlp.down_proj.weight")
    whole("decoder.final_layernorm.weight", spec.final_norm_name)
    if not spec.tie_word_embeddings:          # tied: Megatron's output layer reads the word embeddings
        whole("output_layer.weight", "lm_head.weight")
    return tuple(pieces), shapes
