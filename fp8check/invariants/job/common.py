"""What every job rule shares: the finding it returns and the word for a rule of fp8check's own."""
from __future__ import annotations

import re

from ..base import fail

OWN = "fp8check's own"
NEEDS = ("job",)
# a rule over one stack's keys (`invariant(stacks=...)`): on another stack's job it is not applicable, never "holds"
SKYRL, VERL, NEMO_RL = ("skyrl",), ("verl",), ("nemo-rl",)


def finding(rule: str, key, value, why: str, fix: str = "", severity: str | None = None):
    """A failed job rule: the key as the user writes it, its value, why it fails and what to change. `severity`
    overrides the rule's own for this finding (a condition whose weight depends on the rest of the job)."""
    ev = {"key": key, "value": value, "fix": fix}
    if severity is not None:
        ev["severity"] = severity
    return fail(rule, None, why, **ev)


def module_kind(module: str) -> str:
    """model.layers.3.mlp.experts.7.gate_proj -> mlp.experts.N.gate_proj: one name per kind of module."""
    local = module.split("layers.", 1)[-1].split(".", 1)[-1] if "layers." in module else module
    return re.sub(r"\.\d+\.", ".N.", local)
