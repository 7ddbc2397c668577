"""Name, fusion and shard maps between the trainer (Megatron-Core), the wire (HF checkpoint names) and the
rollout engine (vLLM parameters, per tensor-parallel rank). Built once per SyncConfig (`config.layout`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch is imported where a tensor is made (pre-flight imports this without it)
    import torch

from ..kinds import Granularity
from ..lazy import LazyMap
from ..models import ModelSpec
from .megatron import megatron_pieces
from .pieces import LayoutError, Piece, assemble, covers_whole, disassemble, dst_view, src_view
from .vllm import FUSIONS, ROW_PARALLEL, engine_module, split_layer, vllm_module, vllm_pieces

SCALE_SUFFIX = "_scale_inv"


def scale_name(weight_name: str) -> str:
    """`x.weight` -> `x.weight_scale_inv`; `experts.w13_weight` -> `experts.w13_weight_scale_inv`."""
    return weight_name + SCALE_SUFFIX


def is_scale_name(name: str) -> bool:
    return name.endswith(SCALE_SUFFIX)


def weight_of_scale(name: str) -> str:
    return name[: -len(SCALE_SUFFIX)]


def rank_name(name: str, rank: int, tp: int) -> str:
    """Rollout snapshot key: the vLLM name, prefixed `tp{r}:` when the engine is sharded."""
    return name if tp == 1 else f"tp{rank}:{name}"


def split_rank_name(key: str) -> tuple[int, str]:
    if key.startswith("tp") and ":" in key:
        r, n = key.split(":", 1)
        return int(r[2:]), n
    return 0, key


def _scale_pieces(pieces, fp8_src: set[str], block_shape) -> list[Piece]:
    bn, bk = block_shape
    return [p.scaled(bn, bk, scale_name(p.src), scale_name(p.dst)) for p in pieces if p.src in fp8_src]


def _tensor_scale_pieces(pieces, fp8_src: set[str], rank: int) -> list[Piece]:
    """An engine holding one scale per (fused) parameter and rank (vLLM's online per-tensor FP8): every member's
    scale is the parameter's one scale (`[1]`; routed experts `[E, 1]`, one per expert). In checkpoint
    coordinates a member's scale is `[tp]`, element r being rank r's scale of the parameter it sits in."""
    return [Piece(scale_name(p.src), scale_name(p.dst), rank, 0, 1, dst_index=p.dst_index, shard_id=p.shard_id)
            for p in pieces if p.src in fp8_src]


@dataclass
class LayoutMap:
    spec: ModelSpec
    fp8_hf: frozenset          # HF weight names carried as FP8
    block_shape: tuple         # scale block in (rows, cols) of the weight
    tp: int = 1
    # the engine's scale grid: "block" (the recipe's blocks: a checkpoint engine, online per block) or "tensor"
    # (one scale per fused parameter: online per tensor); the trainer and the wire always use the recipe's blocks
    engine_granularity: Granularity = Granularity.BLOCK
    # HF weight names the engine holds as FP8 (None: fp8_hf; empty: an engine serving BF16)
    engine_fp8_hf: frozenset | None = None
    # the learner's scale grid: "block" (the recipe) or "tensor" (one scale per Megatron tensor: TE delayed
    # scaling; in checkpoint names each member of a fused tensor carries that one scale, [1])
    trainer_granularity: Granularity = Granularity.BLOCK
    # HF members of a trainer-fused FP8 GEMM that travel and are served in high precision (`SyncConfig.split_tensors`):
    # smaller than a block and inside one block row of the fused tensor (Qwen3.5's GDN b and a), each reads that
    # block row's scale in checkpoint names
    shared_scale_hf: frozenset = frozenset()
    megatron: list = field(init=False)
    megatron_shapes: dict = field(init=False)
    vllm: list = field(init=False)          # per rank: pieces
    vllm_shapes: list = field(init=False)   # per rank: shapes

    def __post_init__(self):
        self.megatron, self.megatron_shapes = megatron_pieces(self.spec)
        built = [vllm_pieces(self.spec, self.tp, r) for r in range(self.tp)]
        self.vllm = [b[0] for b in built]
        self.vllm_shapes = [b[1] for b in built]
        self.hf_shapes = {t.name: t.shape for t in self.spec.tensors()}
        self.fp8_megatron = frozenset(p.src for p in self.megatron if p.dst in self.fp8_hf)
        for p in self.megatron:                   # a fused Megatron tensor is FP8 for all its members or none
            if (p.src in self.fp8_megatron) != (p.dst in self.fp8_hf):
                raise LayoutError(f"{p.src}: fused members disagree on FP8 vs high precision ({p.dst})")
        if self.engine_fp8_hf is None:
            self.engine_fp8_hf = self.fp8_hf
        self.fp8_vllm = frozenset(p.dst for p in self.vllm[0] if p.src in self.engine_fp8_hf)
        # engine parameters held in float32 whatever the wire's BF16 (`ModelSpec.engine_fp32`), rank-local names
        self.fp32_vllm = frozenset(p.dst for p in self.vllm[0]
                                   if any(p.src == x or p.src.endswith("." + x) for x in self.spec.engine_fp32))

    def engine_dtype(self, name: str) -> str:
        """The dtype the engine holds a high-precision parameter (rank-local vLLM name) in: float32 where the model
        class makes it so (`fp32_vllm`), else bfloat16."""
        return "float32" if name in self.fp32_vllm else "bfloat16"

    # -- shapes of scale tensors --------------------------------------------------------------------------
    def _scale_shapes(self, shapes: dict, fp8: frozenset) -> dict:
        bn, bk = self.block_shape
        out = {}
        for n in fp8:
            s = shapes[n]
            out[scale_name(n)] = tuple(s[:-2]) + (-(-s[-2] // bn), -(-s[-1] // bk))
        return out

    # -- trainer (Megatron) -> wire (HF) -------------------------------------------------------------------
    def _memo(self, key, make):
        """Pieces are pure data derived from the map: built once per map (the fault matrix syncs hundreds of
        times through one config), handed out as fresh lists."""
        cache = self.__dict__.setdefault("_pieces_memo", {})
        if key not in cache:
            cache[key] = tuple(make())
        return list(cache[key])

    def _trainer_scale_pieces(self) -> list[Piece]:
        return self._memo(("trainer_scales",), self._make_trainer_scale_pieces)

    def _make_trainer_scale_pieces(self) -> list[Piece]:
        if self.trainer_granularity == Granularity.TENSOR:     # == : a caller may pass the string
            return [Piece(scale_name(p.src), scale_name(p.dst), 0, 0, 1) for p in self.megatron
                    if p.src in self.fp8_megatron]
        bn, bk = self.block_shape
        out = []
        for p in self.megatron:
            if p.src not in self.fp8_megatron:
                continue
            try:
                out.append(p.scaled(bn, bk, scale_name(p.src), scale_name(p.dst)))
            except LayoutError:
                if p.dst not in self.shared_scale_hf or p.dst_row or p.src_col or p.cols is not None:
                    raise
                # the member lies inside the block rows it touches: its scale grid's rows are those block rows
                first = p.src_row // bn
                out.append(Piece(scale_name(p.src), scale_name(p.dst), first, 0,
                                 -(-(p.src_row + p.rows) // bn) - first))
        return out

    def _trainer_scale_shapes(self, shapes: dict, fp8) -> dict:
        if self.trainer_granularity == Granularity.TENSOR:     # == : a caller may pass the string
            return {scale_name(n): (1,) for n in fp8}
        return self._scale_shapes(shapes, fp8)

    def megatron_to_hf(self, tensors: dict[str, torch.Tensor], with_scales: bool = True) -> dict[str, torch.Tensor]:
        """Codes/scales/high-precision tensors under Megatron names -> HF names (scales moved in blocks)."""
        pieces = self.megatron
        shapes = dict(self.hf_shapes)
        if with_scales:
            pieces = pieces + self._trainer_scale_pieces()
            shapes.update(self._trainer_scale_shapes(self.hf_shapes, self.fp8_hf))
        return assemble(pieces, tensors, shapes)

    def megatron_to_hf_lazy(self, tensors, with_scales: bool = True) -> "LazyMap":
        """`megatron_to_hf` one HF tensor at a time, each from only the Megatron tensors it is made of (a fault
        reading one layer of a previous step does not make the whole model)."""
        pieces = self.megatron + (self._trainer_scale_pieces() if with_scales else [])
        shapes = {**self.hf_shapes, **self._trainer_scale_shapes(self.hf_shapes, self.fp8_hf)}
        by_dst: dict[str, list] = {}
        for p in pieces:
            by_dst.setdefault(p.dst, []).append(p)
        return LazyMap(by_dst, lambda n: assemble(by_dst[n], {p.src: tensors[p.src] for p in by_dst[n]}, shapes)[n])

    def hf_to_megatron(self, tensors: dict[str, torch.Tensor], with_scales: bool = False) -> dict[str, torch.Tensor]:
        """HF names -> Megatron names (fused tensors rebuilt); with_scales: FP8 codes and their block scales."""
        pieces, shapes = self.megatron, dict(self.megatron_shapes)
        if with_scales:
            pieces = pieces + self._trainer_scale_pieces()
            shapes.update(self._trainer_scale_shapes(self.megatron_shapes, self.fp8_megatron))
        return disassemble(pieces, tensors, shapes)

    # -- wire (HF) -> rollout (vLLM, per rank) -------------------------------------------------------------
    @property
    def per_tensor_engine(self) -> bool:
        return self.engine_granularity == Granularity.TENSOR

    def vllm_param_shapes(self, rank: int = 0) -> dict[str, tuple]:
        """Engine parameter (and scale) -> shape on `rank`: made once per map, shared (callers never write it)."""
        cache = self.__dict__.setdefault("_param_shapes", {})
        if rank not in cache:
            cache[rank] = self._make_param_shapes(rank)
        return cache[rank]

    def _make_param_shapes(self, rank: int) -> dict[str, tuple]:
        shapes = self.vllm_shapes[rank]
        if self.per_tensor_engine:
            return {**shapes, **{scale_name(n): tuple(shapes[n][:-2]) + (1,) for n in self.fp8_vllm}}
        return {**shapes, **self._scale_shapes(shapes, self.fp8_vllm)}

    def vllm_load_pieces(self, rank: int = 0) -> list[Piece]:
        """Weight pieces plus scale pieces for one rank (what the engine's weight loaders follow)."""
        return self._memo(("load", rank), lambda: self._make_load_pieces(rank))

    def _make_load_pieces(self, rank: int) -> list[Piece]:
        if self.per_tensor_engine:
            return self.vllm[rank] + _tensor_scale_pieces(self.vllm[rank], set(self.engine_fp8_hf), rank)
        return self.vllm[rank] + _scale_pieces(self.vllm[rank], set(self.engine_fp8_hf), self.block_shape)

    def engine_hf_scale_shapes(self) -> dict[str, tuple]:
        """Checkpoint-coordinate shapes of the engine's scales (what `vllm_to_hf` returns for them)."""
        if self.per_tensor_engine:
            return {scale_name(n): (self.tp,) for n in self.engine_fp8_hf}
        return self._scale_shapes(self.hf_shapes, self.engine_fp8_hf)

    def hf_to_vllm(self, tensors: dict[str, torch.Tensor], rank: int = 0) -> dict[str, torch.Tensor]:
        return assemble(self.vllm_load_pieces(rank), tensors, self.vllm_param_shapes(rank))

    def rollout_pieces(self, with_scales: bool = True) -> list[Piece]:
        """Every rank's load pieces, destinations named per rank (`rank_name`), as a rollout snapshot keys them."""
        return self._memo(("rollout", with_scales), lambda: [
            replace(p, dst=rank_name(p.dst, r, self.tp)) for r in range(self.tp)
            for p in (self.vllm_load_pieces(r) if with_scales else self.vllm[r])])

    def vllm_to_hf(self, params, with_scales: bool = True, errors: dict[str, str] | None = None,
                   skip=frozenset()) -> dict[str, torch.Tensor]:
        """Undo fusion and TP narrowing: rollout parameters (keys per `rank_name`) back to HF checkpoint
        coordinates. The one inverse the checks, the reference forward and the tests share; `errors` as in
        `disassemble` (strict without it); `skip`: sources not to recover (nor their destinations to read)."""
        shapes = {**self.hf_shapes, **self.engine_hf_scale_shapes()} if with_scales else self.hf_shapes
        pieces = self.rollout_pieces(with_scales)
        if skip:
            pieces = [p for p in pieces if p.src not in skip]
        return disassemble(pieces, params, shapes, errors)

    def rollout_destinations(self) -> dict[str, frozenset]:
        """HF name (weights and scales) -> the rank-named engine parameters its pieces land in."""
        def make():
            out: dict = {}
            for p in self.rollout_pieces():
                out.setdefault(p.src, set()).add(p.dst)
            return [(k, frozenset(v)) for k, v in out.items()]
        return dict(self._memo(("destinations",), make))

    def written_by(self, names) -> frozenset[str]:
        """The rank-named engine parameters (and scales) every element of which the checkpoint tensors `names`
        write: each of their layout pieces has its source among them. What a sync leaves in the others is
        undefined on vLLM 0.26 (its layerwise reload materializes a parameter with `torch.empty_strided` and copies
        it into the kernel's storage whether or not anything was loaded into every row), so only these are judged
        by a re-sync's idempotence; S1 names the rest."""
        names = set(names)
        sources: dict[str, list] = {}
        for p in self.rollout_pieces():
            sources.setdefault(p.dst, []).append(p.src)
        return frozenset(d for d, srcs in sources.items() if all(s in names for s in srcs))

    def ranks_to_params(self, ranks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Per-rank parameter dicts -> one dict keyed per `rank_name`."""
        return {rank_name(n, r, self.tp): t for r, params in enumerate(ranks) for n, t in params.items()}

    def vllm_sources(self, name: str, rank: int = 0) -> list[Piece]:
        """Which HF tensors (and rows) make up one vLLM parameter (for findings' evidence)."""
        return [p for p in self.vllm_load_pieces(rank) if p.dst == name]

    def to_json(self) -> dict:
        """The layout map as data, for manifest.json."""
        return {"tp": self.tp, "block_shape": list(self.block_shape),
                "megatron_to_hf": [[p.src, p.dst, p.src_row, p.dst_row, p.rows] for p in self.megatron],
                "hf_to_vllm": [[[p.src, p.dst, p.src_row, p.dst_row, p.rows, p.src_col, p.cols, p.dst_index,
                                 p.shard_id if not isinstance(p.shard_id, tuple) else list(p.shard_id)]
                                for p in rank] for rank in self.vllm]}


__all__ = ["FUSIONS", "ROW_PARALLEL", "engine_module", "LayoutError", "LayoutMap", "Piece", "assemble", "covers_whole",
           "disassemble",
           "dst_view", "is_scale_name", "rank_name", "scale_name", "split_layer", "split_rank_name", "src_view", "vllm_module",
           "weight_of_scale"]
