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
