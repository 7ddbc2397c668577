"""vLLM 0.26.0's own source, read (never imported: its package needs CUDA builds) so that tests can hold fp8check's
layouts to the names, mappers and config classes vLLM really has. Found at $FP8CHECK_VLLM_SRC, /tmp/src/vllm-0.26.0
(the wheel unzipped: `python3 -m pip download --no-deps --python-version 3.12 --only-binary=:all: vllm==0.26.0`),
or an installed vllm 0.26.0's package directory. Nothing of vLLM's is copied here: the tests read its files."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
from functools import lru_cache

VERSION = "0.26.0"
HOW = (f"vLLM {VERSION}'s source is not here: unzip its wheel (pip download --no-deps --only-binary=:all: "
       f"vllm=={VERSION}) and set FP8CHECK_VLLM_SRC to the directory holding `vllm/`")


def _installed() -> str | None:
    try:
        if importlib.metadata.version("vllm") != VERSION:
            return None
        spec = importlib.util.find_spec("vllm")       # locates the package, imports nothing
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    return os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None


@lru_cache(maxsize=1)
def root() -> str | None:
    """The directory holding vLLM 0.26.0's `vllm/` package, or None."""
    for cand in (os.environ.get("FP8CHECK_VLLM_SRC"), f"/tmp/src/vllm-{VERSION}", _installed()):
        if cand and os.path.isfile(os.path.join(cand, "vllm", "model_executor", "models", "qwen3_5.py")):
            return cand
    return None


def path(rel: str) -> str:
    return os.path.join(root(), rel)


def text(rel: str) -> str:
    with open(path(rel), encoding="utf-8") as f:
        return f.read()


@lru_cache(maxsize=32)
def tree(rel: str) -> ast.Module:
    return ast.parse(text(rel))


def cls(rel: str, name: str) -> ast.ClassDef:
    for node in tree(rel).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{rel}: no class {name}")


def method(c: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in c.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"class {c.name}: no method {name}")


def class_attr(c: ast.ClassDef, name: str) -> ast.expr:
    """The value assigned to a class attribute (`hf_to_vllm_mapper = ...`)."""
    for node in c.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise LookupError(f"class {c.name}: no attribute {name}")


def call_keyword(expr: ast.expr, func: str, keyword: str):
    """The literal value of `keyword=` in the `func(...)` call inside `expr` (through `A | func(...)`)."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and _name(node.func) == func:
            for kw in node.keywords:
                if kw.arg == keyword:
                    return ast.literal_eval(kw.value)
    raise LookupError(f"no {func}({keyword}=...)")


def dict_literals(expr: ast.expr) -> dict:
    """Every dict literal in `expr`, merged left to right (`A.mapping | {...}` gives the right-hand part)."""
    out: dict = {}
    for node in ast.walk(expr):
        if isinstance(node, ast.Dict):
            out.update(ast.literal_eval(node))
    return out


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def self_assignments(fn: ast.FunctionDef) -> list[tuple[str, ast.expr]]:
    """(attribute, value) of every `self.<attribute> = <value>` in a method, in source order (every branch; a
    tuple target `self.a, self.b, self.c = f(...)` gives each attribute the call)."""
    out = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assign):
            continue
        for t in node.targets:
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            for e in elts:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.append((e.attr, node.value))
    out.sort(key=lambda a: (a[1].lineno, a[1].col_offset))
    return out


def constructed(value: ast.expr) -> str | None:
    """The class (or method) name a `self.x = Name(...)` / `self.x = self.make(...)` assignment calls; None for
    anything else (a reference to a module made elsewhere: not a new registration)."""
    if isinstance(value, ast.Call):
        return _name(value.func)
    return None
