"""A memo bounded by the bytes of the tensors it keeps (least recently used first out). The fault matrix builds
hundreds of engines from a few deterministic states, so those states are memoized; at real shapes one model's
export is gigabytes, so the bound is in bytes, not entries, and a value larger than the bound is not kept.
Torch is imported where tensors are handled: a memo can be made where torch must not be imported (the checks'
modules, which pre-flight loads without it)."""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def nbytes(value) -> int:
    """Bytes of every tensor inside a (nested) tuple / list / dict value."""
    import torch
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


def _tensors(value) -> list:
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


class IdentityMemo(Memo):
    """A pure function's result memoized by the identity of the tensors it reads: what the trainer's memoized
    export feeds the checks is the same tensor objects from sync to sync. An entry holds weak references (it keeps
    no input alive; a dead input's id reused by a new tensor misses) and the inputs' and the result's version
    counters: a tensor written in place since (by any view of it) misses, so a fault's changed tensor, a new
    object or the old one written, never reads a clean result. CPU tensors only: PyTorch's own ops are what move a
    version counter, and on a GPU an extension's kernels write in place too. Bounded in bytes and in entries."""

    def __init__(self, max_bytes: int, max_entries: int = 4096):
        super().__init__(max_bytes)
        self.max_entries = max_entries

    def get_for(self, tag, tensors, compute: Callable):
        tensors = tuple(tensors)
        if any(t.device.type != "cpu" for t in tensors):
            # a GPU tensor may be rewritten in place by an extension's kernel (Transformer Engine re-quantizes into
            # the same workspace) without its version counter moving: never served from a memo
            return compute()
        key = (tag, tuple((id(t), t._version) for t in tensors))
        hit = self.lookup(key)
        if hit is not None:
            refs, versions, value = hit
            if all(r() is t for r, t in zip(refs, tensors)) and versions == [t._version for t in _tensors(value)]:
                return value
        value = compute()
        self.put(key, (tuple(weakref.ref(t) for t in tensors), [t._version for t in _tensors(value)],
                       value))
        while len(self._items) > self.max_entries:
            _, (_, s) = self._items.popitem(last=False)
            self._bytes -= s
        return value


def _fingerprint(t: torch.Tensor) -> tuple:
    """A cheap content key for one tensor (shape, dtype and the wrapping sum of its words): equal bytes give equal
    fingerprints; a collision only costs the exact comparison that follows."""
    import torch
    w = _words(t)
    return tuple(t.shape), t.dtype, int(w.sum(dtype=torch.int64)) if w.numel() else 0


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat, as int64 words where their count allows (bytes otherwise)."""
    import torch
    from .formats.bytes import as_bytes
    b = as_bytes(t.contiguous())
    if b.numel() % 8 == 0 and b.storage_offset() % 8 == 0:
        try:
            return b.view(torch.int64)
        except RuntimeError:            # storage not aligned for the wider type
            pass
    return b


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_words(a), _words(b))


class ContentMemo(Memo):
    """A pure function's result memoized by the exact content of the tensors it reads: the key is a fingerprint,
    a hit is taken only when every kept input is byte-identical to the new one (and neither the kept inputs nor
    the result were written in place since). For engine-side work on fresh buffers that hold the same bytes from
    sync to sync (the post-load transform of a module whose checkpoint bytes did not change)."""

    def get_for(self, tag, tensors, compute: Callable):
        tensors = tuple(tensors)
        if any(t.device.type != "cpu" for t in tensors):
            # a GPU tensor may be rewritten in place by an extension's kernel (Transformer Engine re-quantizes into
            # the same workspace) without its version counter moving: never served from a memo
            return compute()
        key = (tag, tuple(_fingerprint(t) for t in tensors))
        hit = self.lookup(key)
        if hit is not None:
            kept, versions, value = hit
            if versions == [t._version for t in (*kept, *_tensors(value))] and \
                    all(_same_bytes(k, t) for k, t in zip(kept, tensors)):
                return value
        value = compute()
        kept = tuple(t.clone() for t in tensors)      # a private copy: the caller's buffers stay the caller's
        self.put(key, (kept, [t._version for t in (*kept, *_tensors(value))], value))
        return value
