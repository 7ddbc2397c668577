"""Layout faults: transposed square weight, q/k and gate/up swaps, TP shard swap, expert permutation, Megatron
order not undone (attention q|k|v, the gated delta-net's in_proj members), A_log / dt_bias exchanged, 128-row block
shift, 1x128 vs 128x128 grid, TE's padded scale layout on the wire."""
from __future__ import annotations

import torch

from fp8check.harness.formats import quantize_blockwise, wire_to_te
from fp8check.harness.formats.bytes import roll_rows
from fp8check.harness.kinds import Granularity
from fp8check.harness.layouts import scale_name

from .base import Fault, NoTarget, fp8_targets, pick, register, replace_tensor, swap, with_rollout


def _transpose_square(c, p, ctx, index=0):
    n = pick(fp8_targets(c, square=True), index)
    p = replace_tensor(p, n, p.tensors[n].t().contiguous())
    return replace_tensor(p, scale_name(n), p.tensors[scale_name(n)].t().contiguous())


register(Fault("square_weight_transposed", "layouts", "payload", ("S2", "S4"),
               "a square FP8 weight (and its scale grid) sent transposed: shapes and dtypes unchanged",
               _transpose_square, applies=lambda c: bool(fp8_targets(c, square=True)), silent=True,
               may=("S1", "S3", "S7")))


def _pairs(c, a, b):
    out = []
    for t in c.spec.tensors():
        if t.name.endswith(a) and t.name in c.fp8_tensors:
            other = t.name[: -len(a)] + b
            if other in c.fp8_tensors and c.spec.tensor_map()[other].shape == t.shape:
                out.append((t.name, other))
    return out


def _swap_pair(a, b):
    def apply(c, p, ctx, index=0):
        x, y = _pairs(c, a, b)[index % len(_pairs(c, a, b))]
        return swap(swap(p, x, y), scale_name(x), scale_name(y))
    return apply


register(Fault("q_k_swapped", "layouts", "payload", ("S2", "S4"),
               "q_proj and k_proj of one layer exchanged where their sizes match", _swap_pair("q_proj.weight", "k_proj.weight"),
               applies=lambda c: bool(_pairs(c, "q_proj.weight", "k_proj.weight")), silent=True,
               may=("S3",)))   # the two scale grids may hold the same values (power-of-two scales of like weights)
register(Fault("gate_up_swapped", "layouts", "payload", ("S2", "S4"),
               "gate_proj and up_proj exchanged (silu applied to the wrong half)", _swap_pair("gate_proj.weight", "up_proj.weight"),
               applies=lambda c: bool(_pairs(c, "gate_proj.weight", "up_proj.weight")), silent=True,
               may=("S3",)))


def _expert_perm(c, p, ctx, layer=0, a=0, b=1):
    pre = f"{c.spec.layer_prefix(layer)}mlp.experts."
    for proj in ("gate_proj", "up_proj", "down_proj"):
        x, y = f"{pre}{a}.{proj}.weight", f"{pre}{b}.{proj}.weight"
        p = swap(swap(p, x, y), scale_name(x), scale_name(y))
    return p


register(Fault("experts_permuted", "layouts", "payload", ("S2", "S3", "S4"),
               "two routed experts' weights exchanged (expert ids mis-mapped)", _expert_perm,
               applies=lambda c: c.spec.is_moe, silent=True))


def _layers_of(c, kind: str) -> list[int]:
    return [i for i, t in enumerate(c.spec.layer_types) if t == kind]


def _layer(c, kind: str, index: int) -> int:
    """The `index`-th layer of `kind` (full_attention / linear_attention); NoTarget where the model has none."""
    idx = _layers_of(c, kind)
    if not idx:
        raise NoTarget(f"no {kind} layer in this model")
    return idx[index % len(idx)]


def _megatron_order(c, p, ctx, layer=0):
    """The sender splits Megatron's linear_qkv as if it were [q; k; v] (per-group interleaving not undone); `layer`:
    which full-attention layer (the first by default: a hybrid model's is not layer 0)."""
    layer = _layer(c, "full_attention", layer)
    m = ctx.megatron()
    src = f"decoder.layers.{layer}.self_attention.linear_qkv.weight"
    codes, sc = m[src], m[scale_name(src)]
    pre = f"{c.spec.layer_prefix(layer)}self_attn."
    row = 0
    for proj in ("q_proj", "k_proj", "v_proj"):
        n = pre + proj + ".weight"
        rows = p.tensors[n].shape[0]
        p = replace_tensor(p, n, codes[row:row + rows].contiguous())
        p = replace_tensor(p, scale_name(n), sc[row // 128:(row + rows) // 128].contiguous())
        row += rows
    return p


register(Fault("megatron_qkv_not_deinterleaved", "layouts", "payload", ("S2", "S3", "S4"),
               "linear_qkv exported in Megatron's per-group [q, k, v] order as if it were HF's [q; k; v]",
               _megatron_order,
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK and bool(_layers_of(c, "full_attention"))
               and f"{c.spec.layer_prefix(_layer(c, 'full_attention', 0))}self_attn.q_proj.weight" in c.fp8_tensors,
               silent=True))


# -- the gated delta-net (Qwen3.5) ----------------------------------------------------------------------------------
GDN_IN_PROJ = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")     # Megatron-Core's in_proj row order


def _gdn_hp(c) -> bool:
    """A gated delta-net model whose fused in_proj travels in high precision (fp8check's default exclusion)."""
    return any(f"{c.spec.layer_prefix(i)}linear_attn.{m}.weight" not in c.fp8_tensors
               for i in _layers_of(c, "linear_attention") for m in GDN_IN_PROJ)


def _in_proj_misordered(c, p, ctx, layer=0):
    """The sender splits Megatron's fused GDN in_proj as [q|k|v|b|a|z] -- z last, the order a converter written
    for another layout assumes -- where Megatron-Core's is [q|k|v|z|b|a] (megatron/core/ssm/gated_delta_net/gdn.py,
    in_proj_split_names): in_proj_qkv keeps its rows, z, b and a are sent other rows of the same GEMM. Every
    shape and dtype holds."""
    i = _layer(c, "linear_attention", layer)
    w = ctx.megatron()[f"decoder.layers.{i}.self_attention.in_proj.weight"]
    la = f"{c.spec.layer_prefix(i)}linear_attn."
    rows = {m: p.tensors[la + m + ".weight"].shape[0] for m in GDN_IN_PROJ}
    row = 0
    for m in ("in_proj_qkv", "in_proj_b", "in_proj_a", "in_proj_z"):
        p = replace_tensor(p, la + m + ".weight", w[row:row + rows[m]].contiguous())
        row += rows[m]
    return p


register(Fault("gdn_in_proj_misordered", "layouts", "payload", ("S4",),
               "the fused gated delta-net in_proj split in another member order ([q|k|v|b|a|z] for Megatron's "
               "[q|k|v|z|b|a]): in_proj_z, in_proj_b and in_proj_a sent other rows", _in_proj_misordered,
               applies=lambda c: bool(_layers_of(c, "linear_attention")) and _gdn_hp(c), silent=True))


def _a_log_dt_bias_swapped(c, p, ctx, layer=0):
    """A_log and dt_bias ([v heads] each) exchanged by the sender's name map."""
    la = f"{c.spec.layer_prefix(_layer(c, 'linear_attention', layer))}linear_attn."
    return swap(p, la + "A_log", la + "dt_bias")


register(Fault("gdn_a_log_dt_bias_swapped", "layouts", "payload", ("S4",),
               "a gated delta-net layer's A_log and dt_bias (both [v heads]) exchanged: the decay reads the time-step "
               "bias and back", _a_log_dt_bias_swapped, applies=lambda c: bool(_layers_of(c, "linear_attention")),
               silent=True))


def _block_shift(c, p, ctx, index=0):
    n = pick([x for x in fp8_targets(c) if c.spec.tensor_map()[x].shape[0] >= 256], index)
    bn = c.recipe.block_shape[0]
    p = replace_tensor(p, n, roll_rows(p.tensors[n], bn))
    return replace_tensor(p, scale_name(n), roll_rows(p.tensors[scale_name(n)], 1))


register(Fault("rows_shifted_one_block", "layouts", "payload", ("S2", "S4"),
               "one weight's rows (and scale rows) rotated by one 128-row block (an off-by-one shard offset)",
               _block_shift, applies=lambda c: c.recipe.granularity is Granularity.BLOCK, silent=True,
               may=("S3",)))   # neighbouring block rows may hold equal power-of-two scales (the property test found one)


def _grid_1x128(c, p, ctx, index=0):
    n = pick(fp8_targets(c), index)
    master = ctx.master_hf()[n].to(torch.bfloat16)
    q, s = quantize_blockwise(master, (1, 128), pow2=c.recipe.pow2)
    return replace_tensor(replace_tensor(p, n, q), scale_name(n), s)


register(Fault("activation_grid_for_weight", "layouts", "payload", ("S4", "S2", "S3"),
               "one weight quantized with 1x128 blocks (the activation grid) and sent with a [N, K/128] scale",
               _grid_1x128, applies=lambda c: c.recipe.granularity is Granularity.BLOCK, destructive=True))


def _te_padded(c, p, ctx, index=0):
    cands = [n for n in fp8_targets(c) if p.tensors[scale_name(n)].dim() == 2
             and p.tensors[scale_name(n)].shape[1] % 4]
    sn = scale_name(pick(cands, index))
    return replace_tensor(p, sn, wire_to_te(p.tensors[sn]))


register(Fault("te_padded_scale_on_wire", "layouts", "payload", ("S4", "S3"),
               "Transformer Engine's stored scale layout (K-blocks padded to a multiple of 4) sent instead of the "
               "unpadded grid", _te_padded,
               applies=lambda c: c.recipe.granularity is Granularity.BLOCK and any(
                   (-(-c.spec.tensor_map()[n].shape[1] // 128)) % 4 for n in fp8_targets(c)), destructive=True))


def _tp_swap(c, index=0):
    """A rank loads the other rank's shard of one row-parallel parameter (a broken TP shard map)."""
    from fp8check.harness.engines.cpu.rollout import ReferenceRollout
    target = pick([n for n in fp8_targets(c) if n.endswith(("o_proj.weight", "down_proj.weight"))], index)
    return ReferenceRollout(c, shard_rank=lambda name, rank: 1 - rank if name in (target, scale_name(target)) else rank)


register(Fault("tp_shards_swapped", "layouts", "engine", ("S2", "S3", "S4"),
               "with tensor parallelism 2, each rank narrows one row-parallel weight to the other rank's columns",
               _tp_swap, applies=lambda c: all(t == "full_attention" for t in c.spec.layer_types),
               configure=with_rollout(tp_size=2), silent=True))


def _pp_double_remap(c, p, ctx, stages=2):
    """Pipeline stages > 0 hold layers under local indices; their scales, already keyed by global names, are
    remapped local -> global once more: layer l's scale_inv is sent under layer l + (layers per stage)."""
    from dataclasses import replace as dc_replace
    layers = len(c.spec.layer_types)
    per_stage = -(-layers // stages)
    if layers < 2:
        raise NoTarget("one layer: no pipeline stage > 0")

    def moved(name):
        i = c.spec.layer_of(name)
        if name.endswith("_scale_inv") and i is not None and i >= per_stage:
            pre = c.spec.layer_prefix(i)
            return c.spec.layer_prefix(i + per_stage) + name[len(pre):]
        return name
    recs = [dc_replace(r, name=moved(r.name)) for r in p.records]
    tensors = {moved(k): v for k, v in p.tensors.items()}
    return type(p)(recs, tensors, p.version)


# ISEEKYAN/Megatron-LM#191: with pipeline parallelism, stages > 0 send another layer's scales (or, past the last
# layer, names the engine does not have) and their own layers keep stale or poisoned scales
# past the last layer the names are unknown to the engine: vLLM 0.26's reload then stops with layers left on the
# meta device (seen on the H200, 2026-12-01): destructive, like unknown_name
register(Fault("pp_scales_remapped_twice", "layouts", "payload", ("S1", "S3", "S4"),
               "pipeline stages > 0 remap their scales' layer index local -> global a second time: layer l's "
               "scale_inv arrives as layer l + layers-per-stage's", _pp_double_remap, silent=True,
               may=("S2", "S7"), destructive=True))
