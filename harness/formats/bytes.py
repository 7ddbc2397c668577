"""Raw bytes of a tensor as a flat uint8 view (a fresh stride-1 copy when the layout needs one: PyTorch calls
a tensor with size-1 dims "contiguous" whatever their strides, and refuses to view those as bytes)."""
import torch


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = torch.empty(flat.numel(), dtype=t.dtype, device=t.device).copy_(flat)
    return flat.view(torch.uint8)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))
