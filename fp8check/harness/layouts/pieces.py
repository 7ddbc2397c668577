"""A layout map as data: pieces that say which rows (and columns) of a source tensor land where in a
destination tensor. The same pieces move codes and (in block units) their scales, so a fused FP8 tensor
and its `weight_scale_inv` are rearranged by one rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch is imported where a tensor is made (pre-flight imports this without it)
    import torch

from ..errors import LayoutError  # noqa: F401 - raised here, defined with the other input errors


@dataclass(frozen=True)
class Piece:
    src: str                 # source tensor name
    dst: str                 # destination tensor name
    src_row: int
    dst_row: int
    rows: int
    src_col: int = 0
    cols: int | None = None  # None: every column
    dst_index: int | None = None   # slot in a stacked [E, ...] destination (experts)
    shard_id: object = None        # vLLM shard id ("q", "k", "v", 0, 1) for the loader

    def scaled(self, bn: int, bk: int, src_name: str, dst_name: str) -> "Piece":
        """The same piece in block units (for the scale grid), or LayoutError when a split is not aligned."""
        # a piece starting at row 0 on both sides may end inside a block (a tensor smaller than one block, e.g. an
        # 8-expert router): its scale rows are the ceiling; any piece after it starts unaligned and is refused
        head = self.src_row == 0 and self.dst_row == 0
        for what, v, b in (("row offset", self.src_row, bn), ("row offset", self.dst_row, bn),
                           ("row count", 0 if head else self.rows, bn), ("column offset", self.src_col, bk)):
            if v % b:
                raise LayoutError(f"{self.src} -> {self.dst}: {what} {v} is not a multiple of the block size {b}; "
                                  f"FP8 codes and block scales cannot be split here (pick dims divisible by {b})")
        cols = None
        if self.cols is not None:
            if self.cols % bk:
                raise LayoutError(f"{self.src} -> {self.dst}: column count {self.cols} is not a multiple of {bk}")
            cols = self.cols // bk
        return Piece(src_name, dst_name, self.src_row // bn, self.dst_row // bn, -(-self.rows // bn),
                     self.src_col // bk, cols, self.dst_index, self.shard_id)


def src_view(t: torch.Tensor, p: Piece) -> torch.Tensor:
    """The rows (and columns) of the source tensor this piece carries."""
    v = t[p.src_row:p.src_row + p.rows]
    if p.cols is not None:
        v = v[:, p.src_col:p.src_col + p.cols]
    return v


def dst_view(t: torch.Tensor, p: Piece) -> torch.Tensor:
    """The slot (expert) and rows of the destination tensor this piece fills."""
    if p.dst_index is not None:
        t = t[p.dst_index]
    return t[p.dst_row:p.dst_row + p.rows]


def _covers(p: Piece, shape: tuple) -> bool:
    """The piece is the whole of a tensor of `shape` on its side: no slot, every row and column."""
    return (p.dst_index is None and p.src_row == 0 and p.dst_row == 0 and len(shape) >= 1 and p.rows == shape[0]
            and p.src_col == 0 and p.cols is None)


def covers_whole(p: Piece, dst_shape: tuple) -> bool:
    """The piece writes every element of a destination of `dst_shape` (no slot, every row and column)."""
    return p.dst_index is None and p.dst_row == 0 and len(dst_shape) >= 1 and p.rows == dst_shape[0] and p.cols is None


def _sole(pieces, key) -> dict:
    """name -> its piece, for names only one piece touches."""
    count: dict = {}
    for p in pieces:
        k = key(p)
        count[k] = None if k in count else p
    return {k: p for k, p in count.items() if p is not None}


def assemble(pieces, sources: dict[str, torch.Tensor], dst_shapes: dict[str, tuple], dtype=None,
             fill=None) -> dict[str, torch.Tensor]:
    """Build every destination tensor from its pieces. `fill` (a scalar) marks rows no piece wrote. A
    destination that is one whole source (an embedding, a norm, an unfused projection) is that source tensor
    itself, not a copy: callers never write the result in place."""
    import torch
    pieces = list(pieces)
    out: dict[str, torch.Tensor] = {}
    for name, p in _sole(pieces, lambda p: p.dst).items():
        src = sources.get(p.src)
        if (src is not None and (dtype is None or src.dtype == dtype) and _covers(p, tuple(src.shape))
                and tuple(src.shape) == tuple(dst_shapes[name])):
            out[name] = src
    for p in pieces:
        if p.dst in out and out[p.dst] is sources.get(p.src):
            continue
        if p.src not in sources:
            raise LayoutError(f"tensor {p.src!r} is missing (needed for {p.dst!r})")
        src = sources[p.src]
        if p.dst not in out:                   # built where the sources live (a trainer's GPU, the host)
            dt = dtype or src.dtype
            out[p.dst] = torch.zeros(dst_shapes[p.dst], dtype=dt, device=src.device) if fill is None else \
                torch.full(dst_shapes[p.dst], fill, dtype=dt, device=src.device)
        v = src_view(src, p)
        d = dst_view(out[p.dst], p)
        if d.shape != v.shape:
            raise LayoutError(f"{p.src} rows {p.src_row}:{p.src_row + p.rows} -> {p.dst}: shape {tuple(v.shape)} "
                              f"does not fit destination slice {tuple(d.shape)}")
        d.copy_(v)
    return out


def disassemble(pieces, dests, src_shapes: dict[str, tuple], errors: dict[str, str] | None = None
                ) -> dict[str, torch.Tensor]:
    """Inverse of `assemble`: recover every source tensor from the destinations (checkpoint coordinates); a source
    that is the whole of one piece is a view of its destination, not a copy (callers never write it in place).
    errors=None: strict, LayoutError on a missing or misshapen destination. A dict: tolerant, for checks on a
    possibly broken engine: the affected source is left out and the reason recorded under its name."""
    import torch
    pieces = list(pieces)
    sole = _sole(pieces, lambda p: p.src)
    out: dict[str, torch.Tensor] = {}
    for p in pieces:
        if errors is not None and p.src in errors:
            continue
        why = None
        if p.dst not in dests:
            why = f"tensor {p.dst!r} is missing (holds {p.src!r})"
        else:
            whole = dests[p.dst]
            try:
                d = dst_view(whole, p)
            except (IndexError, RuntimeError):     # e.g. a scalar where a matrix belongs
                d = None
            if d is None or d.dim() == 0:
                why = f"{p.dst} has shape {list(whole.shape)}, which holds no rows {p.dst_row}:{p.dst_row + p.rows}" + \
                      (f" of slot {p.dst_index}" if p.dst_index is not None else "")
            elif sole.get(p.src) is p and p.src_row == 0 and p.src_col == 0 \
                    and (p.cols is None or p.cols == src_shapes[p.src][-1]) and tuple(d.shape) == tuple(src_shapes[p.src]):
                # (a row-parallel piece names its columns even at TP 1: without this o_proj and down_proj would
                # be copied)
                out[p.src] = d          # the whole source is this view of the destination: no copy
                continue
            else:
                if p.src not in out:
                    out[p.src] = torch.zeros(src_shapes[p.src], dtype=d.dtype, device=d.device)
                v = src_view(out[p.src], p)
                if d.shape != v.shape or d.dtype != v.dtype:
                    why = f"{p.dst} slice has shape {tuple(d.shape)} {d.dtype}, expected {tuple(v.shape)} {v.dtype}"
        if why is None:
            v.copy_(d)
        elif errors is None:
            raise LayoutError(why)
        else:
            errors[p.src] = why
            out.pop(p.src, None)
    return out
