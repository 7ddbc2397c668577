"""`fp8check catalog`: the invariants (with the stack file or tracker each mirrors) and, from the fault registry,
which faults must trip each one (all-must-trip), which may, and for a backstop the fault it fires on beside
others. `--markdown` renders the same rows as the documentation's reference pages (the catalog and the pre-flight
rules), so the pages are generated from the registries."""
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
                     "backstop": inv.backstop or None, "preflight": "job" in inv.needs,
                     "periodic": bool(getattr(inv, "periodic", False))})
    return rows


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def catalog_markdown(rows: list[dict], part: str = "all") -> str:
    """Markdown reference: part `invariants` (what every sync is checked for), `preflight` (the rules over an RL
    job's config) or `all`. One section per entry, its id as the heading (a link target: `catalog.md#s1`)."""
    if part not in ("invariants", "preflight", "all"):
        raise ValueError(f"part must be invariants, preflight or all, got {part!r}")
    out = []
    for title, want in (("Invariants", False), ("Pre-flight rules", True)):
        if part != "all" and (part == "preflight") != want:
            continue
        chosen = [r for r in rows if r["preflight"] == want]
        families = list(dict.fromkeys(r["family"] for r in chosen))
        out.append(f"## {title}\n")
        out.append(f"{len(chosen)} entries in {len(families)} families: "
                   + ", ".join(f"{f} ({sum(r['family'] == f for r in chosen)})" for f in families) + ".\n")
        out.append("| id | family | severity | title |\n|---|---|---|---|")
        out += [f"| [{r['id']}](#{r['id'].lower()}) | {r['family']} | {r['severity']} | {_cell(r['title'])} |" for r in chosen]
        out.append("")
        for r in chosen:
            out.append(f"### {r['id']}\n")
            out.append(f"**{_cell(r['title'])}** ({r['family']}, {r['severity']}"
                       + (", live" if r["live"] else "") + (", periodic" if r["periodic"] else "") + ")\n")
            out.append(f"Condition: {_cell(r['condition'])}\n")
            if r["why"]:
                out.append(f"Why: {_cell(r['why'])}\n")
            out.append(f"Source: {_cell(r['source'])}\n")
            if r["faults"] or r["may_faults"]:
                line = "Faults that must trip it: " + (", ".join(f"`{f}`" for f in r["faults"]) or "none")
                if r["may_faults"]:
                    line += "; that may: " + ", ".join(f"`{f}`" for f in r["may_faults"])
                if r["backstop"]:
                    line += f" (a backstop: fires beside others on `{r['backstop']}`)"
                out.append(line + "\n")
    return "\n".join(out)
