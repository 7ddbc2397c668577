"""Evidence helpers: where two tensors first differ, in both engines' terms."""
from __future__ import annotations

import torch

from harness.layouts import Piece, rank_name


from harness.formats.bytes import as_bytes, bits_equal  # noqa: F401  (re-exported for the checks)


def _elem_bytes(t: torch.Tensor) -> torch.Tensor:
    return as_bytes(t).reshape(t.numel(), t.element_size())


def unravel(flat: int, shape) -> list[int]:
    """Row-major index of a flat position (plain ints: torch.unravel_index costs ~2 ms a call)."""
    idx = []
    for s in reversed(tuple(shape)):
        flat, i = divmod(flat, s)
        idx.append(i)
    return idx[::-1]


def bit_diff(a: torch.Tensor, b: torch.Tensor) -> dict | None:
    """None if a and b are bit-identical, else the first differing element and how many differ."""
    if bits_equal(a, b):                  # the common case, one memcmp-like pass
        return None
    if a.shape != b.shape:
        return {"reason": "shape", "expected_shape": list(a.shape), "actual_shape": list(b.shape)}
    if a.element_size() != b.element_size():
        return {"reason": "dtype", "expected_dtype": str(a.dtype), "actual_dtype": str(b.dtype)}
    ne = (_elem_bytes(a) != _elem_bytes(b)).any(-1)
    n = int(ne.sum())
    if n == 0:
        if a.dtype != b.dtype:
            return {"reason": "dtype", "expected_dtype": str(a.dtype), "actual_dtype": str(b.dtype)}
        return None
    flat = int(ne.nonzero()[0, 0])
    idx = unravel(flat, a.shape)
    return {"reason": "bits", "index": idx, "expected": _show(a, flat), "actual": _show(b, flat),
            "differing": n, "total": a.numel()}


def value_diff(a: torch.Tensor, b: torch.Tensor) -> dict | None:
    """Like bit_diff on float values (NaN == NaN, -0 == 0)."""
    if a.shape != b.shape:
        return {"reason": "shape", "expected_shape": list(a.shape), "actual_shape": list(b.shape)}
    a, b = a.float(), b.float()
    ne = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    n = int(ne.sum())
    if n == 0:
        return None
    flat = int(ne.reshape(-1).nonzero()[0, 0])
    idx = unravel(flat, a.shape)
    return {"reason": "values", "index": idx, "expected": float(a.reshape(-1)[flat]),
            "actual": float(b.reshape(-1)[flat]), "differing": n, "total": a.numel()}


def _show(t: torch.Tensor, flat: int):
    v = t.reshape(-1)[flat]
    raw = _elem_bytes(t)[flat]
    hexs = "".join(f"{int(x):02x}" for x in reversed(raw.tolist()))
    try:
        f = float(v.float())
    except (RuntimeError, TypeError):
        f = None
    return {"value": f, "bits": "0x" + hexs}


def engine_position(pieces: list[Piece], hf_name: str, index: list[int], tp: int) -> dict | None:
    """Translate a checkpoint-coordinate index of `hf_name` into (vLLM parameter, rank, index)."""
    if len(index) < 2:
        return None
    row, col = index[0], index[1]
    for r, rank_pieces in enumerate(pieces):
        for p in rank_pieces:
            if p.src != hf_name or not (p.src_row <= row < p.src_row + p.rows):
                continue
            if p.cols is not None and not (p.src_col <= col < p.src_col + p.cols):
                continue
            pos = ([p.dst_index] if p.dst_index is not None else []) + [p.dst_row + row - p.src_row, col - p.src_col]
            return {"param": rank_name(p.dst, r, tp), "index": pos}
    return None
