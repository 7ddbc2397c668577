"""FP8 constants, named once. The numbers are plain Python; the torch dtypes (and tables keyed by them) are made on
first use, so that what reads only recipes and shapes (pre-flight) never imports torch."""
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
# TE writes NaN inputs as this byte regardless of sign (torch would write 0xFF for -NaN).
E4M3_NAN_BYTE = 0x7F
E5M2_NAN_BYTE = 0x7F

FP8_FORMATS = ("e4m3", "e5m2")  # the keys of FP8_DTYPES

WEIGHT_BLOCK = (128, 128)      # Hopper blockwise recipe: 2D weight blocks
ACT_BLOCK = (1, 128)           # 1D activation / gradient blocks
MX_BLOCK = 32                  # MXFP8: 1x32 blocks along the reduction dim
E8M0_BIAS = 127

_TORCH_NAMES = ("E4M3", "E5M2", "E8M0", "FP8_MAX", "FP8_DTYPES", "INPUT_DTYPE_MAX")


def _torch_constants() -> dict:
    import torch
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    return {
        "E4M3": e4m3, "E5M2": e5m2, "E8M0": torch.float8_e8m0fnu,
        "FP8_MAX": {e4m3: E4M3_MAX, e5m2: E5M2_MAX},
        "FP8_DTYPES": dict(zip(FP8_FORMATS, (e4m3, e5m2))),
        # Largest finite value of the quantizer's input dtype: TE uses it when 448 / amax overflows.
        "INPUT_DTYPE_MAX": {dt: torch.finfo(dt).max for dt in (torch.float32, torch.bfloat16, torch.float16)},
    }


def __getattr__(name):
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals().update(_torch_constants())
    return globals()[name]
