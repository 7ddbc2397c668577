"""The layers of docs/design.md, enforced: every import (module level or inside a function) points down or
sideways, never up; the checks never import engine code; no private name crosses a package; the public face
exports what it promises; every registry agrees with the lists derived from it."""
import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("fp8check",)

# lowest first; a module may import its own layer or any lower one (docs/design.md, "Layers")
LAYERS = [
    ("fp8check.harness.errors", "fp8check.harness.formats", "fp8check.harness.schema", "fp8check.harness.lazy", "fp8check.harness.memo",
     "fp8check.harness.kinds"),
    ("fp8check.harness.bitview",),
    ("fp8check.harness.models", "fp8check.harness.layouts", "fp8check.harness.alignment", "fp8check.harness.digest_words", "fp8check.harness.digest",
     "fp8check.harness.digest_triton"),
    ("fp8check.harness.config", "fp8check.harness.numerics"),
    ("fp8check.harness.sync.payload", "fp8check.harness.sync.transport", "fp8check.harness.record", "fp8check.harness.snapshot", "fp8check.harness.jobconfig",
     "fp8check.harness.strategies"),
    ("fp8check.invariants", "fp8check.harness.engines"),
    ("fp8check.harness.sync.capture", "fp8check.harness.sync.pipeline", "fp8check.harness.sync"),
    ("fp8check.faults",),
    ("fp8check.e2e", "fp8check.harness.integrations"),
    ("fp8check.harness.cli", "fp8check.harness.__main__", "fp8check.harness", "fp8check.__main__", "fp8check"),
]
# siblings of one layer that must not import each other
APART = [("fp8check.invariants", "fp8check.harness.engines")]


def layer_of(module: str) -> int:
    best, depth = None, -1
    for i, group in enumerate(LAYERS):
        for prefix in group:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    if best is None:
        raise AssertionError(f"{module}: in no layer of tests/test_architecture.py (add it to LAYERS)")
    return best


def group_of(module: str) -> str:
    return max((p for g in LAYERS for p in g if module == p or module.startswith(p + ".")), key=len)


def modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def imports(module: str, path: pathlib.Path):
    """(imported module, name or None, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                yield mod, a.name, node.lineno


def ours(mod: str) -> bool:
    return mod.split(".")[0] in PACKAGES


ALL = list(modules())


@pytest.mark.parametrize("module,path", ALL, ids=[m for m, _ in ALL])
def test_imports_point_down(module, path):
    if module == "fp8check":          # the public face sits on top and loads lazily
        return
    mine = layer_of(module)
    for mod, name, line in imports(module, path):
        if not ours(mod):
            continue
        target = mod
        full = f"{mod}.{name}" if name else mod
        if name and importlib.util.find_spec(full.split(".")[0]) and _is_module(full):
            target = full
        theirs = layer_of(target)
        assert theirs <= mine, f"{module}:{line} imports {target} (layer {theirs}) from layer {mine}"
        for a, b in APART:
            ga, gb = group_of(module), group_of(target)
            assert not ({ga, gb} == {a, b} or (ga.startswith(a) and gb.startswith(b)) or
                        (ga.startswith(b) and gb.startswith(a))), f"{module}:{line} imports {target}: {a} and {b} stay apart"


def _is_module(full: str) -> bool:
    try:
        return importlib.util.find_spec(full) is not None
    except (ImportError, ValueError):
        return False


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (module level or inside a function): `from pkg import name`
    points at pkg.name where that is a module, else at pkg (its __init__)."""
    names = {m for m, _ in ALL}
    graph: dict[str, set[str]] = {m: set() for m in names}
    for module, path in ALL:
        for mod, name, _ in imports(module, path):
            if not ours(mod):
                continue
            target = f"{mod}.{name}" if name and f"{mod}.{name}" in names else mod
            while target not in names and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in names and target != module:
                graph[module].add(target)
    return graph


def import_cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_anywhere():
    """Not even inside a layer, and not through a function-level import: a cycle means two modules that cannot be
    understood (or moved) apart."""
    assert import_cycles(import_graph()) == []


def test_the_cycle_detector_sees_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_checks_import_no_engine_code():
    for module, path in ALL:
        if module.startswith("fp8check.invariants"):
            for mod, name, line in imports(module, path):
                assert not (mod or "").startswith("fp8check.harness.engines"), f"{module}:{line} imports {mod}"


def test_no_private_name_crosses_a_package():
    for module, path in ALL:
        top = ".".join(module.split(".")[:3])
        for mod, name, line in imports(module, path):
            if not ours(mod) or not name or not name.startswith("_") or name.startswith("__"):
                continue
            assert ".".join(mod.split(".")[:3]) == top, f"{module}:{line} imports private {name} from {mod}"


# the public API: what users import from `fp8check` (docs/api.md); everything else is imported from its module
PUBLIC = {"check_sync", "watch", "WORKER_EXTENSION", "engine_env", "SyncConfig", "recommended_config",
          "config_from_job", "get_recipe", "Finding", "Verdict", "SyncCheckFailed", "strategies"}


def test_public_face_is_the_small_api_and_every_name_resolves():
    import fp8check
    assert set(fp8check.__all__) == PUBLIC
    for name in fp8check.__all__:
        assert getattr(fp8check, name) is not None, name
        assert name in fp8check.__doc__, f"fp8check's docstring does not describe {name}"
    for internal in ("reference_sync", "run_sync", "FAULTS", "FullRead", "Remote", "ENGINES", "make_engine", "CATALOG"):
        with pytest.raises(AttributeError):
            getattr(fp8check, internal)
    assert fp8check.Verdict.FAIL == "fail" and fp8check.SyncCheckFailed.__mro__[1] is AssertionError


def test_the_strategies_without_hypothesis_are_one_line_naming_the_extra():
    """`fp8check.strategies` in a fresh interpreter where importing hypothesis fails: one ImportError line that
    names the extra to install."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            "try:\n    import fp8check.strategies\nexcept ImportError as e:\n    print('ERR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0] == "ERR fp8check.strategies needs Hypothesis: pip install 'fp8check[strategies]'"
    import fp8check.strategies as fst                  # with hypothesis (the dev extra): the strategies themselves
    assert set(fst.__all__) >= {"weights", "recipes", "model_specs", "sync_configs"} and callable(fst.weights)


def test_a_fresh_install_puts_only_fp8check_at_the_top_of_site_packages(tmp_path):
    """`pip install .` (not editable, no dependencies) of the tracked tree into a target directory: the top level
    holds `fp8check` and its dist-info (plus the console script), the entry points are the CLI and the pytest
    plugin, and `import fp8check; fp8check.check_sync` works from there."""
    import subprocess
    import sys
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        p = ROOT / f.decode()
        if p.is_file():
            (src / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            (src / f.decode()).write_bytes(p.read_bytes())
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(src)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    top = sorted(p.name for p in target.iterdir())
    dist = [n for n in top if n.endswith(".dist-info")]
    assert len(dist) == 1 and dist[0].startswith("fp8check-"), top
    assert set(top) - set(dist) - {"bin"} == {"fp8check"}, top
    entry = (target / dist[0] / "entry_points.txt").read_text()
    assert "fp8check = fp8check.harness.cli:main" in entry
    assert "[pytest11]" in entry and "fp8check = fp8check.harness.integrations.pytest_plugin" in entry
    r = subprocess.run([sys.executable, "-c", "import fp8check; fp8check.check_sync; print(fp8check.__file__)"],
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)},
                       capture_output=True, text=True, timeout=900)      # imports torch: slow on a loaded box
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target / "fp8check" / "__init__.py")


def test_every_module_has_a_docstring_and_none_cites_a_missing_design_file():
    for module, path in ALL:
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        assert doc, f"{module} has no module docstring"
        assert "DESIGN.md" not in path.read_text(), f"{module} cites DESIGN.md (the repository's is docs/design.md)"
