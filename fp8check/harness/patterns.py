"""The exclusion pattern language: how a module name is matched against an exclusion entry (vLLM's
`ignored_layers`, the stacks' keyword lists, fp8check's `exclude`). One rule, read by the config, the job readers,
the reference engine and the exclusion checks."""
from __future__ import annotations

import re


def matches(module: str, pattern: str) -> bool:
    """Exact module matching at name-component boundaries: `mlp.gate` matches `model.layers.0.mlp.gate`
    but never `mlp.gate_up_proj` or `mlp.gate_proj`. `re:<regex>` patterns use re.fullmatch."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], module) is not None
    return module == pattern or module.endswith("." + pattern)


def matches_any(module: str, patterns) -> bool:
    return any(matches(module, p) for p in patterns)


__all__ = ["matches", "matches_any"]
