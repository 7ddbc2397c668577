"""fp32 -> fp8 code cast with TE's saturation and NaN rule."""
import torch

from .constants import E4M3_NAN_BYTE, FP8_MAX


def cast_to_fp8(y: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Round-to-nearest-even with saturation to +-max; NaN -> 0x7F (TE writes the positive NaN)."""
    m = FP8_MAX[fp8_dtype]
    q = y.clamp(-m, m).to(fp8_dtype)
    nan = torch.isnan(y)
    if y.device.type != "cpu":      # no host round trip on a GPU (P1's activations: one per GEMM otherwise)
        return q.view(torch.uint8).masked_fill(nan, E4M3_NAN_BYTE).view(fp8_dtype)
    if nan.numel() and bool(nan.view(torch.uint8).amax()):   # the mask's bytes: the CPU's bool any is ~20x slower
        qb = q.view(torch.uint8).clone()
        qb[nan] = E4M3_NAN_BYTE
        q = qb.view(fp8_dtype)
    return q
