"""The engine's FP8 KV cache in the reference forward: K (after RoPE) and V as vLLM's cache write stores them and its
attention reads them back -- x / scale rounded to E4M3 (nearest even, saturating at +-448: the fp8 conversion's
`satfinite`), times the scale. vLLM's Triton attention reads every token's K and V from the cache, the prompt's
own included, so the log-probs of an engine with `kv_cache_dtype=fp8*` carry this error whatever its weights: a
probe's reference that leaves it out sets its floor below what a perfect sync's engine measures."""
from __future__ import annotations

import torch

from ..formats.constants import E4M3_MAX


def fp8_kv_cache(scale_of):
    """`Weights.kv_quant` for an FP8 KV cache: `scale_of(layer prefix, "k" | "v")` gives the layer's scale."""
    def quant(t: torch.Tensor, prefix: str, which: str) -> torch.Tensor:
        s = float(scale_of(prefix, which))
        return (t.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s
    return quant


def declared_kv_scales(config, trainer, attention) -> dict | str:
    """The k and v scales a perfect sync's engine holds for each attention module (`model.layers.N.self_attn`):
    `rollout.kv_scale` for a uniform cache, or the calibration this sync's trainer carries
    (`model.layers.N.self_attn.{k,v}_scale`); a reason string where a calibrated scale is missing. The one rule for
    R1 (what the engine must serve) and P1 (what its forward reads K and V through)."""
    if not config.calibrated_kv:
        s = float(config.rollout.kv_scale)
        return {a: {"k": s, "v": s} for a in attention}
    if trainer is None:
        return "no trainer snapshot: the calibrated scales this sync declares are unknown"
    out = {}
    for a in attention:
        d = {}
        for which in ("k", "v"):
            t = trainer.get(f"{a}.{which}_scale")
            if t is None:
                return f"the trainer declares no {a}.{which}_scale (calibrated KV-cache scales)"
            d[which] = float(t)
        out[a] = d
    return out


def declared_kv_cache(config, trainer=None):
    """The KV cache a perfect sync's engine runs: None for a high-precision one; an FP8 one at the declared scales
    (`declared_kv_scales` over the model's full-attention layers); a reason string where a calibrated scale is
    missing."""
    if not config.fp8_kv_cache:
        return None
    attention = [f"{config.spec.layer_prefix(i)}self_attn" for i, lt in enumerate(config.spec.layer_types)
                 if lt == "full_attention"]
    scales = declared_kv_scales(config, trainer, attention)
    if isinstance(scales, str):
        return scales
    return fp8_kv_cache(lambda prefix, which: scales[prefix + "self_attn"][which])


__all__ = ["declared_kv_cache", "declared_kv_scales", "fp8_kv_cache"]
