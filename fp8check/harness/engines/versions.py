"""Which sync version each engine parameter holds, from what was installed (records carry versions)."""
from __future__ import annotations

from collections import defaultdict

from ..layouts import is_scale_name, rank_name, scale_name, weight_of_scale


def param_versions(config, items) -> list[dict[str, set]]:
    """items: (hf name, tensor, version). Per rank: vLLM parameter -> set of versions written into it."""
    out = [defaultdict(set) for _ in range(config.rollout.tp_size)]
    for r in range(config.rollout.tp_size):
        by_src = defaultdict(list)
        for p in config.layout.vllm[r]:
            by_src[p.src].append(p.dst)
        for name, _, ver in items:
            if is_scale_name(name):
                for dst in by_src.get(weight_of_scale(name), []):
                    out[r][scale_name(dst)].add(ver)
            else:
                for dst in by_src.get(name, []):
                    out[r][dst].add(ver)
    return out


def served_versions(versions: list[dict[str, set]]) -> list[int]:
    """Every sync version some parameter of the engine holds (one entry: one policy served)."""
    return sorted({v for per_rank in versions for vs in per_rank.values() for v in vs if v is not None})


def versions_meta(versions: list[dict[str, set]], tp: int) -> dict[str, list[int]]:
    """Engine metadata: parameter (per `rank_name`) -> the versions written into it."""
    return {rank_name(n, r, tp): sorted(v for v in vs if v is not None)
            for r, per_rank in enumerate(versions) for n, vs in per_rank.items()}
