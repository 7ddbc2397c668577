"""`fp8check catalog`: the invariants (with the stack file or tracker each mirrors) and, from the fault registry,
which faults must trip each one (all-must-trip), which may, and for a backstop the fault it fires on beside
others."""
from __future__ import annotations


def catalog_rows() -> list[dict]:
    from fp8check.invariants import REGISTRY
    try:
        from fp8check.faults import FAULTS
    except ImportError:          # the catalog stands on its own
        FAULTS = {}
    rows = []
    for inv in REGISTRY.values():
        rows.append({"id": inv.id, "family": inv.family, "title": inv.title, "condition": inv.condition,
                     "scope": inv.scope, "severity": inv.severity, "source": inv.source, "why": inv.why,
                     "live": inv.live, "faults": sorted(f.name for f in FAULTS.values() if inv.id in f.trips),
                     "may_faults": sorted(f.name for f in FAULTS.values() if inv.id in f.may),
                     "backstop": inv.backstop or None})
    return rows
