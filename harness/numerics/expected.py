"""What a rollout engine must hold after a correct sync, derived from the trainer's bytes alone: the layout map
(fusion, TP narrowing) applied, then the engine's *declared* post-load transform. The digest-first capture
compares every engine parameter with it, and the policy probe (P1) runs the reference forward over it: a
perfect sync's engine, built without reading the engine."""
from __future__ import annotations

import torch

from ..layouts import is_scale_name, rank_name, scale_name
from .transforms import apply_post_load


def expected_engine_state(config, trainer_hf: dict, post_load) -> dict[str, torch.Tensor]:
    """vLLM names (rank-named when sharded) -> what the parameter must hold after a correct sync of
    `trainer_hf`."""
    out = {}
    tp = config.rollout.tp_size
    for r in range(tp):
        params = config.layout.hf_to_vllm(trainer_hf, r)
        for n, t in params.items():
            if is_scale_name(n):
                continue
            key = rank_name(n, r, tp)
            if scale_name(n) in params:
                q, s, _ = apply_post_load(post_load, key, t, params[scale_name(n)])
                out[key], out[rank_name(scale_name(n), r, tp)] = q, s
            else:
                out[key] = t.to(torch.bfloat16)
    return out
