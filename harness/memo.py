"""A memo bounded by the bytes of the tensors it keeps (least recently used first out). The fault matrix builds
hundreds of engines from a few deterministic states, so those states are memoized; at real shapes one model's
export is gigabytes, so the bound is in bytes, not entries, and a value larger than the bound is not kept."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch


def nbytes(value) -> int:
    """Bytes of every tensor inside a (nested) tuple / list / dict value."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return 0


class Memo:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._bytes = 0

    def lookup(self, key):
        """The kept value, or None."""
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def fits(self, size: int) -> bool:
        return size <= self.max_bytes

    def put(self, key, value):
        """Keep `value` (unless it alone exceeds the bound), dropping the least recently used ones to make room."""
        size = nbytes(value)
        if not self.fits(size):
            return value
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        self._items[key] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, s) = self._items.popitem(last=False)
            self._bytes -= s
        return value

    def get(self, key, compute: Callable):
        hit = self.lookup(key)
        return hit if hit is not None else self.put(key, compute())

    def clear(self):
        self._items.clear()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
