"""vLLM's own weight checksum (0.32+), computed here the way vLLM computes it: fp8check's mirror of vLLM's algorithm,
not vLLM running.

What vLLM hashes (vllm/model_executor/model_loader/weight_checksum.py, `compute_tensor_digests`, unchanged 0.32 to
0.34): for every entry of `model.named_parameters()` -- parameters only, each tensor once under its first name, so no
buffer (not the KV-cache scales `_k_scale` / `_v_scale`) -- the SHA-256 of `t.detach().cpu().contiguous()` read as
bytes, in hex. A worker prefixes each name with `dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:` (v1/worker/gpu_worker.py,
`_weight_checksum_prefix`), and `POST /weight_checker` (entrypoints/rl/online/api_router.py, with
VLLM_SERVER_DEV_MODE=1) merges the workers' dicts and answers `compare` with `{"match": not mismatches,
"mismatches": sorted keys whose digest differs or is missing on either side}`; `reset` zeroes every parameter.
(vLLM also walks the partitions of a SharedWeightParameter and the inner tensors of a tensor subclass; fp8check's
engines hold neither, and the mirror takes plain tensors.)

The baseline is the engine's own earlier checksum: a round trip (checksum, reset, the same sync again, compare)
proves the same bytes came back, not that the trainer's bytes arrived, and a buffer never enters it. fp8check's
catalog judges the engine against the trainer's tensors and reads the KV-cache scales: e2e/oracles.py sets the two
side by side.
"""
from __future__ import annotations

import hashlib

from ..layouts import split_rank_name


def checksum_prefix(*, dp: int = 0, pp: int = 0, pcp: int = 0, tp: int = 0) -> str:
    """The key prefix one vLLM worker puts on its checksums."""
    return f"dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:"


def tensor_checksum(t) -> str:
    """SHA-256 (hex) of a tensor's bytes in row-major order of its logical shape, as vLLM hashes a parameter."""
    import torch
    flat = t.detach().cpu().contiguous().view(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()


def weight_checksums(params: dict, *, dp: int = 0, pp: int = 0, pcp: int = 0, tp: int = 0) -> dict[str, str]:
    """One worker's `compute_weight_checksums`: `params` maps vLLM parameter names to the tensors the worker's
    parameters are (vLLM's layout and orientation)."""
    pre = checksum_prefix(dp=dp, pp=pp, pcp=pcp, tp=tp)
    return {pre + name: tensor_checksum(t) for name, t in params.items()}


def snapshot_checksums(tensors: dict) -> dict[str, str]:
    """The checksums every worker of an engine would report for a rollout snapshot's kernel tensors (keys as
    `harness.layouts.rank_name` writes them: `tp{r}:name` when sharded). Correct where fp8check reads the engine's
    parameters as vLLM holds them: a block-FP8 checkpoint engine and a BF16 one (vLLM's online per-tensor FP8 keeps
    its codes transposed, which the worker extension reads back in checkpoint orientation)."""
    out = {}
    for key, t in tensors.items():
        rank, name = split_rank_name(key)
        out[checksum_prefix(tp=rank) + name] = tensor_checksum(t)
    return out


def compare_checksums(checksums: dict[str, str], baseline: dict[str, str]) -> dict:
    """`POST /weight_checker {"action": "compare", "baseline": ...}`'s answer for these checksums."""
    mismatches = sorted(k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k))
    return {"match": not mismatches, "mismatches": mismatches}


__all__ = ["checksum_prefix", "compare_checksums", "snapshot_checksums", "tensor_checksum", "weight_checksums"]
