"""Evidence helpers: where two tensors first differ, in both engines' terms. Computing evidence (the first
differing element, how many differ) costs a pass over the tensor: checks ask for it only for the findings they
report (`evidence=False` past the cap), and it is found chunk by chunk (harness.bitview)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch and the numerics are imported in the checks that compute: pre-flight imports this without them
    import torch

from fp8check.harness.layouts import Piece, rank_name

__all__ = ["bit_diff", "bits_equal", "engine_position", "screened", "unravel", "value_diff"]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (harness.bitview.bits_equal, imported when first compared)."""
    from fp8check.harness.bitview import bits_equal as equal
    return equal(a, b)


def screened(steps: list, out: list, limit: int | None = None) -> None:
    """Append to `out`, in order, each step's finding: `steps` holds findings, or (flag, detail) pairs whose
    `detail(out)` (a finding or None) runs only where the flag is set; with `limit`, stop once `out` holds that
    many. The flags (harness.bitview.differs / flag: on a GPU 0-d tensors) cross to the host at once, so a check
    over every FP8 tensor waits on the device once, not once per comparison; the evidence (`detail`) costs a pass
    only where something differs."""
    from fp8check.harness.bitview import resolve
    flags = iter(resolve([s[0] for s in steps if isinstance(s, tuple)]))
    for s in steps:
        if limit is not None and len(out) >= limit:
            return
        if not isinstance(s, tuple):
            out.append(s)
        elif next(flags):
            f = s[1](out)
            if f is not None:
                out.append(f)


def unravel(flat: int, shape) -> list[int]:
    """Row-major index of a flat position, as plain ints (no tensor round trip: torch.unravel_index is far dearer
    for one index)."""
    idx = []
    for s in reversed(tuple(shape)):
        flat, i = divmod(flat, s)
        idx.append(i)
    return idx[::-1]


def bit_diff(a: torch.Tensor, b: torch.Tensor, evidence: bool = True) -> dict | None:
    """None if a and b are bit-identical, else the first differing element and how many differ (with
    `evidence=False`, only that they differ)."""
    from fp8check.harness.bitview import bit_chunks, bits_equal, bytes_equal, first_difference
    if bits_equal(a, b):                  # the common case, one memcmp-like pass
        return None
    if a.shape != b.shape:
        return {"reason": "shape", "expected_shape": list(a.shape), "actual_shape": list(b.shape)}
    if a.element_size() != b.element_size():
        return {"reason": "dtype", "expected_dtype": str(a.dtype), "actual_dtype": str(b.dtype)}
    if not evidence:
        if a.dtype != b.dtype and bytes_equal(a, b):
            return {"reason": "dtype", "expected_dtype": str(a.dtype), "actual_dtype": str(b.dtype)}
        return {"reason": "bits"}
    flat, n = first_difference(bit_chunks(a, b))
    if n == 0:
        if a.dtype != b.dtype:
            return {"reason": "dtype", "expected_dtype": str(a.dtype), "actual_dtype": str(b.dtype)}
        return None
    idx = unravel(flat, a.shape)
    return {"reason": "bits", "index": idx, "expected": _show(a, flat), "actual": _show(b, flat),
            "differing": n, "total": a.numel()}


def value_diff(a: torch.Tensor, b: torch.Tensor, evidence: bool = True) -> dict | None:
    """Like bit_diff on float values (NaN == NaN, -0 == 0)."""
    from fp8check.harness.bitview import bits_equal, first_difference, value_chunks
    if a.shape != b.shape:
        return {"reason": "shape", "expected_shape": list(a.shape), "actual_shape": list(b.shape)}
    if bits_equal(a, b):                  # identical bits: identical values (one word compare, no fp32 pass)
        return None
    flat, n = first_difference(value_chunks(a, b))
    if n == 0:
        return None
    if not evidence:
        return {"reason": "values"}
    idx = unravel(flat, a.shape)
    return {"reason": "values", "index": idx, "expected": float(a.reshape(-1)[flat].float()),
            "actual": float(b.reshape(-1)[flat].float()), "differing": n, "total": a.numel()}


def _show(t: torch.Tensor, flat: int):
    from fp8check.harness.formats.bytes import as_bytes
    v = t.reshape(-1)[flat]
    raw = as_bytes(t).reshape(t.numel(), t.element_size())[flat]
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
