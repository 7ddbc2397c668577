"""The documentation's generated pages, made at build time from the registries and the records (an MkDocs hook,
`hooks:` in mkdocs.yml; tests/test_docs.py imports it too):

  reference/catalog.md          the invariants, from fp8check.invariants' registry and the fault registry
  reference/preflight-rules.md  the pre-flight rules, from the same registry
  results.md                    every measured figure, from results/*.json (command, commit, date, machine each)
  changelog.md                  CHANGELOG.md

Nothing generated is committed, so none of it can go stale."""
from __future__ import annotations

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
FIELDS = ("command", "commit", "date", "machine")          # what every figure carries, from itself or its record
SECTIONS = ("Conformance and tests on the GPU", "Live on the GPU", "Speed on the GPU", "The RL comparison",
            "Speed on the CPU", "GPU CI")


class BadRecord(ValueError):
    """A results/*.json file that does not hold a figure's command, commit, date and machine."""


def machines() -> dict:
    with open(os.path.join(RESULTS, "machines.json")) as f:
        return json.load(f)


def load_records() -> list[tuple[str, dict]]:
    """(file name, record) for every results/*.json but machines.json, validated: each figure resolves every FIELD
    (its own or its record's), the commit is a hash, the date ISO, the machine a key of machines.json."""
    known, out = machines(), []
    for name in sorted(os.listdir(RESULTS)):
        if not name.endswith(".json") or name == "machines.json":
            continue
        with open(os.path.join(RESULTS, name)) as f:
            r = json.load(f)
        for key in ("title", "section", "figures"):
            if not r.get(key):
                raise BadRecord(f"results/{name}: no {key}")
        if r["section"] not in SECTIONS:
            raise BadRecord(f"results/{name}: section {r['section']!r} is none of {SECTIONS}")
        for i, fig in enumerate(r["figures"]):
            if not fig.get("what") or not fig.get("value"):
                raise BadRecord(f"results/{name}: figure {i} lacks what or value")
            got = {k: fig.get(k) or r.get(k) for k in FIELDS}
            missing = [k for k, v in got.items() if not v]
            if missing:
                raise BadRecord(f"results/{name}: figure {fig['what']!r} has no {', '.join(missing)}")
            if not re.fullmatch(r"[0-9a-f]{7,40}", got["commit"]):
                raise BadRecord(f"results/{name}: figure {fig['what']!r}: commit {got['commit']!r} is not a hash")
            if not re.fullmatch(r"\d{4}-\d\d-\d\d", got["date"]):
                raise BadRecord(f"results/{name}: figure {fig['what']!r}: date {got['date']!r} is not YYYY-MM-DD")
            if got["machine"] not in known:
                raise BadRecord(f"results/{name}: machine {got['machine']!r} is not in results/machines.json")
        out.append((name, r))
    return out


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def results_markdown() -> str:
    records, known = load_records(), machines()
    out = ["# Results", "",
           "Every figure fp8check reports, generated from the records in `results/*.json`. Each names the command "
           "that produced it, the commit it ran, the date and the machine: a figure is what that command measured "
           "at that commit on that machine. The GPU CI's jobs write new records as artifacts (`ci/record.py`).", "", "## Machines", "", "| machine | what it is |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in known.items()]
    out.append("")
    for section in SECTIONS:
        chosen = [(n, r) for n, r in records if r["section"] == section]
        if not chosen:
            continue
        out += [f"## {section}", ""]
        for name, r in chosen:
            out += [f"### {r['title']}", "", f"Record: `results/{name}`." + (f" {r['about']}." if r.get("about") else ""), ""]
            groups: dict = {}
            for fig in r["figures"]:
                key = tuple(fig.get(k) or r.get(k) for k in FIELDS)
                groups.setdefault(key, []).append(fig)
            for (command, commit, date, machine), figs in groups.items():
                out += [f"`{command}` at `{commit}`, {date}, on `{machine}`:", "", "| figure | value |", "|---|---|"]
                out += [f"| {_cell(f['what'])} | {_cell(f['value'])} |" for f in figs]
                out.append("")
    return "\n".join(out)


def catalog_page(part: str) -> str:
    from fp8check.harness.cli.catalog import catalog_markdown, catalog_rows
    title, intro = {
        "invariants": ("The invariant catalog",
                       "What every weight sync is checked for: the sync invariants (S), serving (R), the scale-format "
                       "and environment contract (C), the exclusion set (X), alignment (A) and the log-prob probe (P). "
                       "Generated from the registry (`fp8check catalog` prints the same; `--json` for tools). A check "
                       "with nothing to check is UNKNOWN, never PASS; no check changes the engine it reads."),
        "preflight": ("Pre-flight rules",
                      "The rules `fp8check preflight JOB.yaml` runs over an RL job's own config and environment, "
                      "besides the config rules (C, X, A) of the [catalog](catalog.md) over the resolved config. "
                      "Generated from the registry; `fp8check preflight --explain ID` prints one."),
    }[part]
    return f"# {title}\n\n{intro}\n\n" + catalog_markdown(catalog_rows(), part)


def changelog_page() -> str:
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        return f.read()


GENERATED = {"reference/catalog.md": lambda: catalog_page("invariants"),
             "reference/preflight-rules.md": lambda: catalog_page("preflight"),
             "results.md": results_markdown, "changelog.md": changelog_page}


def on_files(files, config):
    """MkDocs: add the generated pages to the site."""
    import sys
    from mkdocs.structure.files import File
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)         # the catalog pages import fp8check from this tree
    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    return files
