"""The checks' GPU kernels compiled before the first sync: a Triton kernel compiles on its first launch (a second
or more per variant), which would land in the first sync's catalog. The engines call this
at start (the vLLM adapter in its workers, the device path in the trainer's process); nothing it touches
outlives the call but the compiled kernels."""
from __future__ import annotations

from ..kinds import Granularity, ScaleFormat


def warm_kernels(device, recipe=None) -> list[str]:
    """Launch every kernel variant a sync's capture and checks use, on tiny inputs on `device` (the quantizer's in
    `recipe`'s scale mode: C1's weight blocks, P1's 1x128 activation blocks); returns what was warmed (nothing off
    CUDA or without Triton)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return []
    done = []
    try:
        from .. import digest_triton as dt
        from ..formats import triton_blockwise as tb
        from ..formats import zero_blocks as zb
    except ImportError:
        return done
    if dt.triton is None:
        return done
    x = torch.zeros(2 * dt.BLOCK * 4 + 64, dtype=torch.uint8, device=device)
    # a 16-byte-aligned run (VEC), a 4-byte-aligned one (WORD), an odd one (BYTES)
    groups = [[(x[:256], 0)], [(x[4:260], 0)], [(x[1:7], 0)]]
    for sent in (None, [1, 1, 1], [2, 2, 2], [4, 4, 4]):
        dt.lane_sums_pieces(groups, sent)
    done.append("digest")
    q = torch.zeros(256, 256, dtype=torch.float8_e4m3fn, device=device)
    s = torch.ones(2, 2, dtype=torch.float32, device=device)
    zb._kernel_flags([(q, s), (q[:, 4:132], s[:, :1].contiguous())], (128, 128))
    done.append("zero_blocks")
    if tb.triton is not None and recipe is not None and recipe.granularity is Granularity.BLOCK:
        pow2, eps = recipe.scale_format is ScaleFormat.POW2, float(recipe.amax_epsilon)
        w = torch.randn(256, 256, device=device)
        for x, block in ((w.bfloat16(), tuple(recipe.block_shape)), (w, tuple(recipe.block_shape)), (w, (1, 128))):
            tb.quantize_blockwise_triton(x, block_shape=block, pow2=pow2, amax_epsilon=eps)
        done.append("quantizer")
        from ..formats import triton_requantize as tr
        q, sc = tb.quantize_blockwise_triton(w.bfloat16(), block_shape=tuple(recipe.block_shape), pow2=pow2,
                                             amax_epsilon=eps)
        for m in (w.bfloat16(), w):           # C1's master dtypes: BF16, fp32 with fp8_param
            tr.requantize_mismatch([m], [q], [sc], tuple(recipe.block_shape), pow2=pow2, amax_epsilon=eps)
        done.append("requantize")
    torch.cuda.synchronize(device)
    return done
