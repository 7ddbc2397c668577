"""The README is user documentation that cannot go stale: its pytest-plugin snippet runs verbatim (the vLLM one
needs a GPU: tests/gpu/test_user_engine.py); every console block marked `<!-- output: NAME -->` is run and must
print what it shows; every count and id range it states agrees with the registries; the e2e defaults it describes
are the command's; and it stays short, with no development history and no commit hash."""
import os
import re
import subprocess
import sys

import pytest

from readme_snippets import ROOT, markers, output, snippet

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")


def _text() -> str:
    return open(README).read()


def _prose() -> str:
    """The README without its code blocks (those are run or matched against real output)."""
    return re.sub(r"```.*?```", "", _text(), flags=re.S)


def test_the_plugin_snippet_runs_verbatim(tmp_path):
    (tmp_path / "test_readme_snippet.py").write_text(snippet("pytest"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"\b2 passed\b", out.strip().splitlines()[-1]), out[-2000:]


def test_every_marker_finds_its_block_and_docs_pages_repeat_the_readmes():
    assert sorted(markers("snippet")) == ["pytest", "vllm"]
    assert sorted(markers("output")) == ["faults", "preflight", "snapshot"]
    for n in markers("snippet"):
        assert snippet(n).strip()
    for page in sorted(os.listdir(DOCS)):
        path = os.path.join(DOCS, page)
        if page.endswith(".md"):
            for n in markers("snippet", path):
                assert snippet(n, path) == snippet(n), f"docs/{page}: snippet {n} differs from the README's"
            for n in markers("output", path):
                assert output(n, path) == output(n), f"docs/{page}: output {n} differs from the README's"


# -- the console blocks: run each command, match what it prints ----------------------------------------------------
def _steps(block: str) -> list[tuple[str, int, list[str]]]:
    """(command, expected exit code, expected lines) per `$ ` line of a console block. A line `...` skips any lines;
    `...` inside a line matches anything; runs of spaces are one space. `# exit N` ends a command that exits N."""
    steps, lines = [], block.splitlines()
    i = 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"output block line {lines[i]!r} before any command"
        cmd = lines[i][2:]
        while cmd.rstrip().endswith("\\"):
            i += 1
            cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
        m = re.search(r"\s+#\s*exit (\d+)\s*$", cmd)
        rc = int(m.group(1)) if m else 0
        cmd = cmd[:m.start()] if m else cmd
        i += 1
        want = []
        while i < len(lines) and not lines[i].startswith("$ "):
            want.append(lines[i])
            i += 1
        steps.append((cmd, rc, want))
    return steps


def _norm(line: str) -> str:
    return " ".join(line.split())


def _matches(want: list[str], got: list[str]) -> str | None:
    """None when the expected lines appear in order in the output (`...` lines free), else the first that does not."""
    pos = 0
    got = [_norm(g) for g in got]
    for w in want:
        if w.strip() == "...":
            continue
        rx = re.compile(".*".join(re.escape(p) for p in _norm(w).split("...")))
        while pos < len(got) and not rx.fullmatch(got[pos]):
            pos += 1
        if pos == len(got):
            return w
        pos += 1
    return None


@pytest.mark.parametrize("name", ["faults", "snapshot", "preflight"])
def test_the_readmes_console_blocks_print_what_they_show(name, tmp_path):
    (tmp_path / "examples").symlink_to(os.path.join(ROOT, "examples"))
    env = dict(os.environ) | {"COLUMNS": "250", "OMP_NUM_THREADS": "1",
                              "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for cmd, rc, want in _steps(output(name)):
        run = re.sub(r"^fp8check ", f"{sys.executable} -m fp8check ", cmd)
        run = re.sub(r"^python ", f"{sys.executable} ", run)
        r = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == rc, f"{cmd}: exit {r.returncode}, the README says {rc}\n{r.stdout[-3000:]}{r.stderr[-2000:]}"
        missing = _matches(want, r.stdout.splitlines())
        assert missing is None, f"{cmd}: prints no line like {missing!r}\n{r.stdout[-4000:]}"


def test_the_matcher_is_strict():
    assert _matches(["a ... c", "...", "x"], ["a b  c", "y", "x"]) is None
    assert _matches(["x", "a ... c"], ["a b c", "x"]) == "a ... c"          # order matters
    assert _matches(["OK: 181 faults"], ["OK: 182 faults"]) == "OK: 181 faults"


# -- what the prose states -------------------------------------------------------------------------------------------
def _registry_counts() -> dict[str, int]:
    from fp8check.faults import FAULTS
    from fp8check.harness.formats import RECIPES
    from fp8check.invariants import REGISTRY
    rules = sum("job" in inv.needs for inv in REGISTRY.values())
    return {"fault injectors": len(FAULTS), "faults": len(FAULTS), "pre-flight rules": rules, "rules": rules,
            "invariants": len(REGISTRY) - rules, "recipes": len(RECIPES)}


COUNTED = r"fault injectors?|pre-flight rules?|faults?|rules?|invariants?|recipes?|checks?|models?|engines?|families"


def test_every_count_the_readme_states_is_the_registrys():
    counts, prose = _registry_counts(), " ".join(_prose().split())
    stated = re.findall(r"\b(\d+) ((?:[a-z-]+ ){0,2}?(?:" + COUNTED + r"))\b", prose)
    assert stated, "the README states no count (the test would check nothing)"
    for n, noun in stated:
        assert noun in counts, f"README states '{n} {noun}', which no registry count backs (tests/test_readme.py)"
        assert int(n) == counts[noun], f"README states {n} {noun}; the registry holds {counts[noun]}"


def test_every_id_range_the_readme_states_is_the_registrys():
    from fp8check.invariants import REGISTRY
    ranges = re.findall(r"\b([A-Z])(\d+)-\1(\d+)\b", _prose())
    assert ranges
    for prefix, lo, hi in ranges:
        ids = [i for i, inv in REGISTRY.items() if i[0] == prefix and i[1:].isdigit()]
        checks = [int(i[1:]) for i in ids if "job" not in REGISTRY[i].needs]
        nums = checks or [int(i[1:]) for i in ids]
        assert (int(lo), int(hi)) == (min(nums), max(nums)), \
            f"README states {prefix}{lo}-{prefix}{hi}; the registry holds {prefix}{min(nums)}-{prefix}{max(nums)}"


def test_the_e2e_default_the_readme_describes_is_the_commands():
    import argparse
    from fp8check.harness.cli import e2e
    sub = argparse.ArgumentParser().add_subparsers()
    e2e.register(sub)
    a = sub.choices["e2e"].parse_args(["--out", "x"])
    prose = " ".join(_prose().split())
    m = re.search(r"Without other flags it runs (.*?), (\d+) seeds x (\d+) RL steps", prose)
    assert m, "the README no longer describes e2e's default run"
    arms = re.findall(r"`([a-z0-9-]+)`", m.group(1))
    assert (",".join(sorted(arms)), int(m.group(2)), int(m.group(3))) == (",".join(sorted(a.arms.split(","))),
                                                                           a.seeds, a.steps)


HISTORY = [r"\bsessions?\b", r"\bwe (found|measured|fixed|saw|tried|ran|learned)\b", r"\b20\d\d-\d\d-\d\d\b",
           r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth) "
           r"(session|run|call|attempt)\b", r"\b(no longer|used to|was fixed|were fixed|found broken|taught us|"
           r"at commit|earlier runs?|previous runs?|last run|this commit)\b", r"\bcall \d+\b", r"\bgpu_plan\b"]


def test_the_readme_is_short_and_narrates_no_history():
    text = _text()
    assert len(text.splitlines()) <= 200
    for rx in HISTORY:
        m = re.search(rx, text, re.I)
        assert m is None, f"README narrates history: {m.group(0)!r} (pattern {rx})"


def test_the_readme_holds_no_commit_hash():
    """A hex word of 7 to 40 characters with a digit (an abbreviated hash may be all digits): a commit hash. The
    README has no generated table; figures with their commits live in results/*.json."""
    for word in re.findall(r"\b[0-9a-f]{7,40}\b", _text()):
        assert not re.search(r"\d", word), f"README holds a commit hash: {word}"


def _test_command(text: str) -> str:
    """The command after the README's `# the tests` comment, its continuation lines joined."""
    lines = text[text.index("# the tests"):].split("\n")[1:]
    cmd = []
    for ln in lines:
        cmd.append(ln.strip().rstrip("\\").strip())
        if not ln.rstrip().endswith("\\"):
            break
    return " ".join(cmd)


def test_ci_runs_the_readmes_test_command_verbatim():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    cmd = _test_command(_text())
    assert cmd.endswith("pytest -n auto") and cmd.startswith("pip install torch==2.13.0"), cmd
    joined = re.sub(r"\\\n\s*", "", ci)
    assert " ".join(cmd.split()) in " ".join(joined.split()), (cmd, joined)
    assert _test_command(open(os.path.join(DOCS, "getting-started.md")).read()) == cmd
