"""HF checkpoint names -> the parameters vLLM 0.26 holds, with tensor-parallel narrowing.

vLLM concatenates q|k|v into `qkv_proj` and gate|up into `gate_up_proj` along dim 0 (measured on the H200,
shared/gpu/README.md item 2); routed experts become `mlp.experts.w13_weight` [E, 2I, H] (gate rows first, then
up) and `w2_weight` [E, H, I]; the gated delta-net projections fuse into `in_proj_qkvz` and `in_proj_ba`.
Column-parallel parameters narrow each shard's rows per rank; row-parallel ones narrow columns. A multimodal
wrapper's language model (Qwen3.5: checkpoint `model.language_model.*`) lives under `language_model.model.*`
(`VLLM_PREFIXES`).
"""
from __future__ import annotations

from functools import lru_cache

from ..models import EMBEDDING, LINEAR, MULTIMODAL, ModelSpec
from .pieces import LayoutError, Piece

# checkpoint -> parameter name prefixes of vLLM 0.26's multimodal wrappers: the hf_to_vllm_mapper the Qwen3.5
# classes inherit (orig_to_new_prefix, model_executor/models/qwen3_vl.py:1705-1711), in the order it applies them
VLLM_PREFIXES = {arch: (("model.visual.", "visual."), ("lm_head.", "language_model.lm_head."),
                        ("model.language_model.", "language_model.model.")) for arch in MULTIMODAL}

# (fused module suffix, [(member module suffix, vLLM shard id)]) in concatenation order
FUSIONS = (
    ("self_attn.qkv_proj", (("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v"))),
    ("mlp.gate_up_proj", (("mlp.gate_proj", 0), ("mlp.up_proj", 1))),
    ("mlp.shared_expert.gate_up_proj", (("mlp.shared_expert.gate_proj", 0), ("mlp.shared_expert.up_proj", 1))),
    # (member order; vLLM loads Qwen3.5's checkpoint q|k|v into output shards 0-2 of in_proj_qkvz and z into shard 3:
    # Qwen3_5Model.hf_to_vllm_mapper, model_executor/models/qwen3_5.py:213-221)
    ("linear_attn.in_proj_qkvz", (("linear_attn.in_proj_qkv", 0), ("linear_attn.in_proj_z", 1))),
    ("linear_attn.in_proj_ba", (("linear_attn.in_proj_b", 0), ("linear_attn.in_proj_a", 1))),
)
# row-parallel linears: narrow the input (column) dim under TP
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj", "mlp.shared_expert.down_proj", "linear_attn.out_proj")
EXPERT_MODULE = "mlp.experts"
# vLLM 0.26's FusedMoE is a runner holding the routed experts as a child (measured names on the H200:
# model.layers.N.mlp.experts.routed_experts.w13_weight)
ROUTED_EXPERTS = "mlp.experts.routed_experts"


def engine_module(param_name: str) -> str:
    """vLLM parameter (or its `_scale_inv`) -> the module that owns it: `...qkv_proj.weight` -> `...qkv_proj`,
    `...routed_experts.w13_weight` -> `...routed_experts.w13`."""
    if param_name.endswith("_scale_inv"):
        param_name = param_name[: -len("_scale_inv")]
    if param_name.endswith(("w13_weight", "w2_weight")):
        return param_name.rsplit("_", 1)[0]
    return param_name.rsplit(".", 1)[0]


def split_layer(module: str):
    """model.layers.3.mlp.gate_proj -> ("model.layers.3.", "mlp.gate_proj") (any prefix before `layers.N.`:
    model.language_model.layers.3.mlp.gate_proj -> ("model.language_model.layers.3.", "mlp.gate_proj"));
    non-layer names -> ("", name)."""
    parts = module.split(".")
    for i in range(len(parts) - 2):
        if parts[i] == "layers" and parts[i + 1].isdigit():
            return ".".join(parts[:i + 2]) + ".", ".".join(parts[i + 2:])
    return "", module


def vllm_name(spec: ModelSpec, hf_name: str) -> str:
    """A checkpoint name under the engine's prefix (`VLLM_PREFIXES`; other architectures: unchanged)."""
    for old, new in VLLM_PREFIXES.get(spec.architecture, ()):
        if hf_name.startswith(old):
            return new + hf_name[len(old):]
    return hf_name


def checkpoint_name(spec: ModelSpec, name: str) -> str:
    """`vllm_name`'s inverse: an engine name under the checkpoint's prefix."""
    for old, new in VLLM_PREFIXES.get(spec.architecture, ()):
        if name.startswith(new):
            return old + name[len(new):]
    return name


def vllm_module(spec: ModelSpec, hf_module: str) -> tuple[str, object]:
    """HF module name -> (vLLM module name, shard id or expert id)."""
    vmod, shard = _vllm_module(hf_module)
    return vllm_name(spec, vmod + ".")[:-1], shard


@lru_cache(maxsize=1 << 16)
def _vllm_module(hf_module: str) -> tuple[str, object]:
    prefix, local = split_layer(hf_module)
    for fused, members in FUSIONS:
        for member, shard in members:
            if local == member:
                return prefix + fused, shard
    if local.startswith(EXPERT_MODULE + "."):
        _, _, e, proj = local.split(".")
        return prefix + ROUTED_EXPERTS + (".w2" if proj == "down_proj" else ".w13"), (int(e), proj)
    return hf_module, None


def tp_split_dim(hf_module: str) -> int:
    """The weight dim tensor parallelism narrows for an HF module's GEMM: 1 (input columns) for row-parallel
    linears (o_proj, down_proj of the MLP and of every expert, out_proj), else 0 (output rows)."""
    local = split_layer(hf_module)[1]
    return 1 if local in ROW_PARALLEL or local.endswith("down_proj") else 0


def _shard_rows(rows: int, tp: int, rank: int, what: str) -> tuple[int, int]:
    if rows % tp:
        raise LayoutError(f"{what}: {rows} rows do not split over tensor-parallel size {tp}")
    n = rows // tp
    return rank * n, n


def vllm_pieces(spec: ModelSpec, tp: int = 1, rank: int = 0) -> tuple[list[Piece], dict[str, tuple]]:
    """Pieces from HF weight tensors to vLLM parameters of one TP rank, and the rank-local parameter shapes.

    Only `.weight` (and plain parameter) tensors; `layout.scale_pieces` derives the scale pieces.
    """
    if tp > 1 and any(t != "full_attention" for t in spec.layer_types):
        raise LayoutError(f"model {spec.name!r}: tensor parallelism is not modelled for gated delta-net layers")
    tensors = spec.tensors()
    pieces: list[Piece] = []
    shapes: dict[str, tuple] = {}
    fused_rows: dict[str, int] = {}
    for t in tensors:
        module, leaf = t.module, t.name.rsplit(".", 1)[1]
        vmod, shard = vllm_module(spec, module)
        if isinstance(shard, tuple):                       # routed expert
            e, proj = shard
            I, H = spec.moe_intermediate_size, spec.hidden_size
            if proj == "down_proj":
                c0, cn = _shard_rows(I, tp, rank, t.name)
                dst = vmod + "_weight"
                shapes[dst] = (spec.num_experts, H, cn)
                pieces.append(Piece(t.name, dst, 0, 0, H, c0, cn, dst_index=e, shard_id=(e, "w2")))
            else:
                r0, rn = _shard_rows(I, tp, rank, t.name)
                dst = vmod + "_weight"
                shapes[dst] = (spec.num_experts, 2 * rn, H)
                off = 0 if proj == "gate_proj" else rn
                pieces.append(Piece(t.name, dst, r0, off, rn, dst_index=e,
                                    shard_id=(e, "w1" if proj == "gate_proj" else "w3")))
            continue
        dst = f"{vmod}.{leaf}"
        if shard is not None:                              # member of a fused column-parallel linear
            r0, rn = _shard_rows(t.shape[0], tp, rank, t.name)
            off = fused_rows.get(dst, 0)
            pieces.append(Piece(t.name, dst, r0, off, rn, shard_id=shard))
            fused_rows[dst] = off + rn
            shapes[dst] = (off + rn, t.shape[1])
            continue
        local = split_layer(module)[1]
        if t.kind == LINEAR and local in ROW_PARALLEL:
            c0, cn = _shard_rows(t.shape[1], tp, rank, t.name)
            pieces.append(Piece(t.name, dst, 0, 0, t.shape[0], c0, cn))
            shapes[dst] = (t.shape[0], cn)
        elif t.kind == EMBEDDING:                          # vocab-parallel rows
            r0, rn = _shard_rows(t.shape[0], tp, rank, t.name)
            pieces.append(Piece(t.name, dst, r0, 0, rn))
            shapes[dst] = (rn,) + tuple(t.shape[1:])
        else:                                              # replicated (norms, router, 1D params)
            pieces.append(Piece(t.name, dst, 0, 0, t.shape[0]))
            shapes[dst] = tuple(t.shape)
    return pieces, shapes
