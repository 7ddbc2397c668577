"""The documentation site: its generated pages come from the registries and from results/*.json (docs/hooks.py),
every record carries each figure's command, commit, date and machine, and the navigation holds every page. The
site itself is built with warnings as errors by .ci/run (`mkdocs build --strict`)."""
import importlib.util
import json
import os
import re
import shutil

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
    spec = importlib.util.spec_from_file_location("fp8check_docs_hooks", os.path.join(ROOT, "docs", "hooks.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raw_records():
    d = os.path.join(ROOT, "results")
    return {n: json.load(open(os.path.join(d, n))) for n in sorted(os.listdir(d))
            if n.endswith(".json") and n != "machines.json"}


def test_every_record_gives_each_figure_its_command_commit_date_and_machine():
    machines = json.load(open(os.path.join(ROOT, "results", "machines.json")))
    records = _raw_records()
    assert len(records) >= 10
    for name, r in records.items():
        for fig in r["figures"]:
            for key in ("command", "commit", "date", "machine"):
                v = fig.get(key) or r.get(key)
                assert v, f"results/{name}: figure {fig['what']!r} has no {key}"
            assert re.fullmatch(r"[0-9a-f]{7,40}", fig.get("commit") or r["commit"]), name
            assert (fig.get("machine") or r["machine"]) in machines, name
    assert [n for n, _ in _hooks().load_records()] == list(records)


@pytest.mark.parametrize("drop", ["commit", "date", "machine", "command"])
def test_a_record_without_a_figures_field_is_refused(tmp_path, drop):
    hooks = _hooks()
    shutil.copy(os.path.join(ROOT, "results", "machines.json"), tmp_path)
    r = {"title": "t", "section": "Speed on the CPU", "machine": "cpu-2core", "date": "2026-12-04",
         "commit": "abcdef1", "command": "fp8check bench", "figures": [{"what": "w", "value": "v"}]}
    r.pop(drop)
    (tmp_path / "x.json").write_text(json.dumps(r))
    hooks.RESULTS = str(tmp_path)
    with pytest.raises(hooks.BadRecord, match=f"has no {drop}"):
        hooks.load_records()


def test_the_results_page_is_generated_from_the_records():
    """Every figure's value appears on the page, under its own command, commit, date and machine (read here from
    the JSON files, not through the generator)."""
    page = _hooks().results_markdown()
    machines = json.load(open(os.path.join(ROOT, "results", "machines.json")))
    for key in machines:
        assert f"| `{key}` |" in page
    for name, r in _raw_records().items():
        assert f"`results/{name}`" in page
        for fig in r["figures"]:
            cmd, commit, date, machine = (fig.get(k) or r.get(k) for k in ("command", "commit", "date", "machine"))
            header = f"`{cmd}` at `{commit}`, {date}, on `{machine}`:"
            assert header in page, (name, header)
            esc = [" ".join(fig[k].split()).replace("|", "\\|") for k in ("what", "value")]
            row = f"| {esc[0]} | {esc[1]} |"
            tail = page[page.index(header):]
            assert row in tail, (name, row)


def test_the_reference_pages_hold_every_registered_id():
    from fp8check.invariants import REGISTRY
    hooks = _hooks()
    catalog, rules = hooks.catalog_page("invariants"), hooks.catalog_page("preflight")
    preflight = {i for i, inv in REGISTRY.items() if "job" in inv.needs}
    for i in REGISTRY:
        page, other = (rules, catalog) if i in preflight else (catalog, rules)
        assert f"\n### {i}\n" in page and f"\n### {i}\n" not in other, i
    assert f"{len(preflight)} entries" in rules and f"{len(REGISTRY) - len(preflight)} entries" in catalog


def test_the_navigation_holds_every_page_and_only_pages_that_exist():
    cfg = yaml.safe_load(open(os.path.join(ROOT, "mkdocs.yml")))

    def pages(nav):
        for item in nav:
            for v in item.values():
                yield from (pages(v) if isinstance(v, list) else [v])
    nav = list(pages(cfg["nav"]))
    generated = set(_hooks().GENERATED)
    written = {os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "docs")) for d, _, fs in
               os.walk(os.path.join(ROOT, "docs")) for f in fs if f.endswith(".md")}
    assert sorted(nav) == sorted(written | generated)
    assert not written & generated, "a generated page is also committed"


def test_no_page_points_at_the_removed_plan_or_raw_logs():
    for d, _, fs in os.walk(os.path.join(ROOT, "docs")):
        for f in fs:
            text = open(os.path.join(d, f)).read()
            for stale in ("gpu_plan.sh", "ci/gpu-results", "ci/e2e-results"):
                assert stale not in text, (f, stale)
