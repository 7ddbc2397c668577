"""The layers of docs/design.md, enforced: every import (module level or inside a function) points down or
sideways, never up; the checks never import engine code, and no engine imports the faults; no private name crosses
a package; no production module reads a flag that tests flip; the public face exports what it promises; every
registry agrees with the lists derived from it."""
import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("fp8check",)

# lowest first; a module may import its own layer or any lower one (docs/design.md, "Layers")
LAYERS = [
    ("fp8check.harness.errors", "fp8check.harness.formats", "fp8check.harness.schema", "fp8check.harness.lazy", "fp8check.harness.memo",
     "fp8check.harness.kinds", "fp8check.harness.patterns"),
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


def test_no_engine_imports_the_faults():
    """An engine is what a fault corrupts, never where one comes from: the faults drive an engine through its
    protocol (knobs, install), so an engine that imports them would inject from inside."""
    bad = [f"{module}:{line} imports {mod}{'.' + name if name else ''}"
           for module, path in ALL if module.startswith("fp8check.harness.engines")
           for mod, name, line in imports(module, path)
           if mod == "fp8check.faults" or (mod or "").startswith("fp8check.faults.")
           or (mod == "fp8check" and name == "faults")]
    assert bad == [], "engines import the faults:\n" + "\n".join(bad)


# A flag tests flip is a second production path chosen by a global: the caller passes the choice instead (an
# argument defaulting to production's: bitview.ScreenMode, digest_triton's keep_plans=, C1's fused=). A flag is a
# module-level bool; tests may still shrink a size (CHUNK, BLOCKS_PER_PROGRAM), which chooses no path.
TEST_FLAG_NAME = re.compile(r"_(ON|OFF)_(CPU|CUDA|GPU|DEVICE)$")
TEST_FLAG_COMMENT = re.compile(r"^#\s*(tests?|for tests|only tests)\b", re.IGNORECASE)
TEST_DIRS = ("tests", "examples")


def _upper(name: str) -> bool:
    return bool(re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name))


def module_flags(path: pathlib.Path) -> dict[str, tuple[int, str]]:
    """A module's module-level bool constants: UPPER_CASE name -> (line, the line's trailing comment or "")."""
    text = path.read_text()
    lines, out = text.splitlines(), {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)):
            continue
        line = lines[node.end_lineno - 1]
        comment = line[line.index("#"):] if "#" in line[node.end_col_offset:] else ""
        for t in targets:
            if isinstance(t, ast.Name) and _upper(t.id):
                out[t.id] = (node.lineno, comment)
    return out


def says_test_flag(name: str, comment: str) -> bool:
    return bool(TEST_FLAG_NAME.search(name) or TEST_FLAG_COMMENT.search(comment))


FLAGS = {(module, name): where for module, path in ALL for name, where in module_flags(path).items()}


def test_no_production_module_declares_a_test_flag():
    """No module-level bool whose name (`*_ON_CPU`, `*_OFF_CUDA`) or comment (`# tests: ...`) says tests flip it."""
    bad = [f"{module}:{line} {name} {comment}" for (module, name), (line, comment) in sorted(FLAGS.items())
           if says_test_flag(name, comment)]
    assert bad == [], "production reads a flag tests flip; let the caller pass the choice:\n" + "\n".join(bad)


def _test_sources():
    for d in TEST_DIRS:
        yield from sorted((ROOT / d).rglob("*.py"))


def _aliases(tree) -> dict[str, str]:
    """Local name -> the fp8check module an import anywhere in the file (module or function level) binds it to:
    `import fp8check.a.b as x`, `from fp8check.a import b as x`, `import fp8check`."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if ours(a.name):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and ours(node.module):
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def flag_writes(tree) -> list[tuple[int, str, str]]:
    """(line, target, NAME), in line order, for every `setattr(target, "NAME", ...)` (monkeypatch's too),
    `monkeypatch.setattr("target.NAME", ...)` and `target.NAME = ...` (also inside a tuple) with an UPPER_CASE
    NAME; a dotted-string target is written with its quotes."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f, args = node.func, node.args
            if not ((isinstance(f, ast.Name) and f.id == "setattr") or (isinstance(f, ast.Attribute)
                                                                         and f.attr == "setattr")):
                continue
            if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                if _upper(args[1].value):
                    out.append((node.lineno, ast.unparse(args[0]), args[1].value))
            elif args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                target, _, name = args[0].value.rpartition(".")
                if target and _upper(name):
                    out.append((node.lineno, repr(target), name))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(e, ast.Attribute) and _upper(e.attr):
                        out.append((node.lineno, ast.unparse(e.value), e.attr))
    return sorted(out)


def flipped_flags(source: str, flags=None) -> list[str]:
    """The module flags (`flags`: (module, NAME) -> where; default every fp8check module's) a test's source
    writes: through a name its imports bind to an fp8check module, a dotted "fp8check...." target, or -- where the
    target is bound to nothing of ours (a module a helper returned, `dt = load(...)`) -- anything, when NAME is
    some fp8check module's flag."""
    flags = FLAGS if flags is None else flags
    tree = ast.parse(source)
    aliases, modules_of = _aliases(tree), {}
    for module, name in flags:
        modules_of.setdefault(name, []).append(module)
    out = []
    for line, target, name in flag_writes(tree):
        if name not in modules_of:
            continue
        dotted = target.strip("'\"")
        root, _, rest = dotted.partition(".")
        module = aliases[root] + ("." + rest if rest else "") if root in aliases else dotted if ours(root) else None
        if module is None or (module, name) in flags:
            out.append(f"{line}: {target}.{name} ({', '.join(sorted(modules_of[name]))})")
    return out


def test_no_test_flips_a_production_flag():
    """No test or example writes an fp8check module's module-level bool (monkeypatch.setattr, setattr or an
    assignment): production reads no global a test flips."""
    bad = [f"{path.relative_to(ROOT)}:{b}" for path in _test_sources() for b in flipped_flags(path.read_text())]
    assert bad == [], "tests flip production flags; pass the choice as an argument instead:\n" + "\n".join(bad)


def test_the_flag_rules_see_a_flag(tmp_path):
    """Both rules fire on what they exist for (bitview's former `DEFER_ON_CPU = False  # tests: ...`, and a test's
    monkeypatch of it, its assignment, its dotted setattr and a setattr on a module a helper returned), and pass a
    size a test shrinks, a bool no comment marks, and another module's attribute of the flag's name."""
    src = tmp_path / "mod.py"
    src.write_text('"""m."""\nCHUNK = 1 << 24\nDEFER_ON_CPU = False      # tests: CPU tensors defer\n'
                   'KEEP: bool = True  # tests: plans everywhere\nPLAIN = True  # a real switch\n')
    flags = module_flags(src)
    assert set(flags) == {"DEFER_ON_CPU", "KEEP", "PLAIN"}
    assert sorted(n for n, (_, c) in flags.items() if says_test_flag(n, c)) == ["DEFER_ON_CPU", "KEEP"]
    source = ("import fp8check.harness.bitview as bv\nimport fp8check.invariants.sync as isync\n"
              "def test_a(monkeypatch):\n    monkeypatch.setattr(bv, 'DEFER_ON_CPU', True)\n"
              "    monkeypatch.setattr(bv, 'CHUNK', 64)\n"
              "    old, bv.DEFER_ON_CPU = bv.DEFER_ON_CPU, True\n"
              "    monkeypatch.setattr('fp8check.harness.bitview.DEFER_ON_CPU', True)\n"
              "    dt = load()\n    monkeypatch.setattr(dt, 'DEFER_ON_CPU', True)\n"
              "    monkeypatch.setattr(isync, 'DEFER_ON_CPU', True)\n")
    assert [(line, name) for line, _, name in flag_writes(ast.parse(source))] == \
        [(4, "DEFER_ON_CPU"), (5, "CHUNK"), (6, "DEFER_ON_CPU"), (7, "DEFER_ON_CPU"), (9, "DEFER_ON_CPU"),
         (10, "DEFER_ON_CPU")]
    got = flipped_flags(source, {("fp8check.harness.bitview", n): w for n, w in flags.items()})
    assert [g.split(":")[0] for g in got] == ["4", "6", "7", "9"], got


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
