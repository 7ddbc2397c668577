"""Reporters: findings (plain data) -> terminal table, JSON, JUnit XML. Rendering never decides validity."""
from __future__ import annotations

import json
import os
import sys
from xml.sax.saxutils import escape, quoteattr

from rich.console import Console
from rich.table import Table

STYLE = {"pass": "green", "fail": "bold red", "unknown": "yellow", "ok": "green", "error": "bold red",
         "warning": "yellow", "n/a": "dim"}


def console(stream=None) -> Console:
    """Tables follow the terminal's width; piped into a log they are 120 columns (COLUMNS overrides), and summary
    lines are printed with soft wrap so a log keeps each on one line."""
    stream = stream or sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None if tty else int(os.environ.get("COLUMNS", "120") or 120)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False, force_terminal=None if tty else False)


def _evidence_line(ev: dict) -> str:
    if not ev:
        return ""
    parts = []
    if "stage" in ev:
        parts.append(f"at {ev['stage']}")
    if "index" in ev:
        parts.append(f"first diff {ev['index']}")
    if "expected" in ev and "actual" in ev:
        e, a = ev["expected"], ev["actual"]
        fmt = lambda v: f"{v.get('value')} ({v.get('bits')})" if isinstance(v, dict) else str(v)  # noqa: E731
        parts.append(f"trainer {fmt(e)} vs rollout {fmt(a)}")
    if "rollout" in ev and isinstance(ev["rollout"], dict):
        parts.append(f"= {ev['rollout']['param']}{ev['rollout']['index']}")
    if "differing" in ev:
        parts.append(f"{ev['differing']}/{ev['total']} differ")
    if "count" in ev and "total" in ev and "differing" not in ev:
        parts.append(f"{ev['count']}/{ev['total']} elements")
    return "; ".join(parts)


def _plain(cell: str) -> str:
    from rich.text import Text
    return Text.from_markup(cell).plain


def print_rows(con: Console, title: str, columns, rows, head) -> None:
    """Rows as a table where every word of every cell fits its column whole -- a tensor or fault name is never
    cut, so it can be copied (into `--fault`, a grep) -- and otherwise, on a narrow terminal, one block per row:
    the `head` columns on one line, never wrapped, then each other column as `name: value`, wrapped at spaces
    under an indent. Cells are rich markup."""
    from rich.padding import Padding
    from rich.text import Text
    columns, head = list(columns), [c for c in columns if c in head]
    words = [max([len(w) for w in col.split()] + [len(w) for r in rows for w in _plain(r[i]).split()] + [1])
             for i, col in enumerate(columns)]
    full = [max([len(col)] + [len(_plain(r[i])) for r in rows]) for i, col in enumerate(columns)]
    avail = con.width - 3 * len(columns) - 1          # a border and a space either side per column
    if sum(words) <= avail:
        # every column at least its longest word; the room left shared by what each column's text could use
        # (the widths are set, not left to rich, which let a table overflow the terminal and be cropped)
        room, want = avail - sum(words), [f - w for f, w in zip(full, words)]
        widths = list(full) if sum(want) <= room else \
            [w + room * x // max(sum(want), 1) for w, x in zip(words, want)]
        t = Table(title=title, show_lines=False, expand=False)
        for col, w in zip(columns, widths):
            t.add_column(col, width=w, overflow="fold")
        for r in rows:
            t.add_row(*r)
        con.print(t)
        return
    con.print(Text(title, style="italic"), soft_wrap=True)
    for r in rows:
        cells = dict(zip(columns, r))
        con.print("  ".join(cells[c] for c in head if _plain(cells[c])), soft_wrap=True)
        for c in columns:
            if c not in head and _plain(cells[c]):
                con.print(Padding(Text.from_markup(f"[dim]{c}:[/] {cells[c]}"), (0, 0, 0, 4), expand=False))


def print_findings(con: Console, findings, title: str = "findings", show_pass: bool = True) -> None:
    """The findings: id, verdict, tensor, what, evidence (`print_rows`: no tensor name is ever cut)."""
    rows = [[f.invariant_id, f"[{STYLE[f.verdict]}]{f.verdict}[/]", f.tensor or "", f.message,
             _evidence_line(f.evidence)] for f in findings if show_pass or f.verdict != "pass"]
    print_rows(con, title, ("id", "verdict", "tensor", "what", "evidence"), rows, head=("id", "verdict", "tensor"))


def findings_json(findings, **extra) -> str:
    from fp8check.invariants.base import by_invariant, overall
    return json.dumps({"verdict": overall(findings), "invariants": by_invariant(findings),
                       "failing": sorted({f.invariant_id for f in findings if f.verdict == "fail"}),
                       "findings": [f.to_json() for f in findings], **extra}, indent=1, default=str)


def junit_xml(suite: str, cases: list[tuple[str, str, str, str]]) -> str:
    """cases: (classname, name, verdict, message). fail -> <failure>, unknown -> <error>."""
    fails = sum(1 for c in cases if c[2] == "fail")
    errs = sum(1 for c in cases if c[2] == "unknown")
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuite name={quoteattr(suite)} tests="{len(cases)}" failures="{fails}" errors="{errs}">']
    for cls, name, verdict, msg in cases:
        out.append(f'  <testcase classname={quoteattr(cls)} name={quoteattr(name)}>')
        if verdict == "fail":
            out.append(f'    <failure message={quoteattr(msg[:500])}>{escape(msg)}</failure>')
        elif verdict == "unknown":
            out.append(f'    <error message={quoteattr(msg[:500])}>{escape(msg)}</error>')
        out.append('  </testcase>')
    out.append('</testsuite>')
    return "\n".join(out) + "\n"
