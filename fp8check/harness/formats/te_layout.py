"""Transformer Engine's stored scale layout <-> the unpadded wire grid.

TE (Float8BlockwiseQTensor, compact=False) pads the scale's last dim to a multiple of 4 and stores 1D (1x128)
scales transposed: for data [N, K]
  2D 128x128 rowwise    : [ceil(N/128), roundup(ceil(K/128), 4)]
  2D 128x128 columnwise : [ceil(K/128), roundup(ceil(N/128), 4)]   (the grid of the transposed data)
  1D 1x128 rowwise      : [ceil(K/128), roundup(N, 4)]               (transposed)
  1D 1x128 columnwise   : [ceil(N/128), roundup(K, 4)]               (transposed, of the transposed data)
The wire (vLLM checkpoint) layout is always the unpadded, untransposed grid of the rowwise data.
"""
from __future__ import annotations

import torch


def _roundup(v: int, m: int = 4) -> int:
    return -(-v // m) * m


def wire_to_te(scale_inv: torch.Tensor, block_dim: int = 2, columnwise: bool = False) -> torch.Tensor:
    """Unpadded rowwise grid -> TE's padded stored layout (padding is zero)."""
    s = scale_inv
    if block_dim == 2 and columnwise:
        s = s.t()
    elif block_dim == 1 and not columnwise:
        s = s.t()                     # rowwise 1D scales are stored [gK, N]; columnwise ones [gN, K] as given
    rows, cols = s.shape
    out = torch.zeros((rows, _roundup(cols)), dtype=s.dtype, device=s.device)
    out[:, :cols] = s
    return out


def te_to_wire(te_scale: torch.Tensor, data_shape, block_dim: int = 2, columnwise: bool = False,
               block: int = 128) -> torch.Tensor:
    """TE's padded stored layout -> the unpadded grid over `data_shape` ([N, K] of the rowwise data)."""
    n, k = data_shape
    g = lambda v: -(-v // block)  # noqa: E731
    if block_dim == 2:
        if columnwise:
            return te_scale[: g(k), : g(n)].t().contiguous()
        return te_scale[: g(n), : g(k)].contiguous()
    if columnwise:                    # 1D blocks along N of the transposed data: [gN, K] stored
        return te_scale[: g(n), :k].contiguous()
    return te_scale[: g(k), :n].t().contiguous()
