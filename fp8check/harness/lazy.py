"""A read-only mapping whose values are computed when read: at real shapes a model's tensors are produced one at
a time (masters drawn per tensor, values dequantized per use) instead of all held at once."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Callable


class LazyMap(Mapping):
    """`keys` in order; `compute(key)` makes a value on every read (or once, with `cache=True`)."""

    def __init__(self, keys: Iterable[str], compute: Callable, *, cache: bool = False):
        self._keys = list(keys)
        self._known = set(self._keys)
        self._compute = compute
        self._cache: dict | None = {} if cache else None

    def __getitem__(self, key):
        if key not in self._known:
            raise KeyError(key)
        if self._cache is None:
            return self._compute(key)
        if key not in self._cache:
            self._cache[key] = self._compute(key)
        return self._cache[key]

    def __contains__(self, key) -> bool:
        return key in self._known

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def lazy_exports(package: str, namespace: dict, exports: dict[str, tuple[str, ...]]):
    """PEP 562 for a package `__init__`: `exports` maps a submodule (".blockwise") to the names it provides; each
    is imported on first use and then cached in `namespace`. Returns (`__getattr__`, `__dir__`, `__all__`). Why:
    `fp8check preflight` reads recipes, models and the rule catalog without importing torch (2.5-2.9 s of its 2 s
    budget); a package that imported every submodule eagerly would pull torch in through any one name."""
    import importlib
    where = {name: mod for mod, names in exports.items() for name in names}

    def __getattr__(name):
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(mod, package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__, sorted(where)
