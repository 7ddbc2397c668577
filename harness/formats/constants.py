"""FP8 constants, named once."""
import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E8M0 = torch.float8_e8m0fnu
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
# TE writes NaN inputs as this byte regardless of sign (torch would write 0xFF for -NaN).
E4M3_NAN_BYTE = 0x7F
E5M2_NAN_BYTE = 0x7F

FP8_MAX = {E4M3: E4M3_MAX, E5M2: E5M2_MAX}
FP8_DTYPES = {"e4m3": E4M3, "e5m2": E5M2}

WEIGHT_BLOCK = (128, 128)      # Hopper blockwise recipe: 2D weight blocks
ACT_BLOCK = (1, 128)           # 1D activation / gradient blocks
MX_BLOCK = 32                  # MXFP8: 1x32 blocks along the reduction dim
E8M0_BIAS = 127

# Largest finite value of the quantizer's input dtype: TE uses it when 448 / amax overflows.
INPUT_DTYPE_MAX = {
    torch.float32: torch.finfo(torch.float32).max,
    torch.bfloat16: torch.finfo(torch.bfloat16).max,
    torch.float16: torch.finfo(torch.float16).max,
}
