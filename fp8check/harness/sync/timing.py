"""Where one sync's time and memory went (`SyncResult.seconds`), kept apart from the stages that spend them.

`Clock` gathers named parts in seconds (`clock("wire")`, a block; `clock.add`, a measured part), the garbage
collector's pauses inside a block (`clock.gc`), and the CUDA memory a part added over the sync's own (the
`*_bytes` keys). `seconds()` is the mapping a result carries: seconds rounded to 0.1 ms, bytes as counted.
"""
from __future__ import annotations

import contextlib
import gc
import time


class Clock:
    """Seconds by part of a sync; a part timed twice adds up (the poison is started, then waited for)."""

    def __init__(self):
        self.t: dict = {}
        self._mem = self._mem_checks = None       # CUDA memory where the capture, then the checks, began

    @contextlib.contextmanager
    def __call__(self, key: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - t0)

    def add(self, key: str, seconds: float) -> float:
        self.t[key] = self.t.get(key, 0.0) + seconds
        return seconds

    def update(self, parts: dict, prefix: str = "") -> None:
        self.t.update({f"{prefix}{k}": v for k, v in parts.items()})

    @contextlib.contextmanager
    def gc(self, key: str):
        """The garbage collector's pauses inside the block, as `key` (`_GCPauses`)."""
        pauses = _GCPauses().start()
        try:
            yield
        finally:
            self.t[key] = pauses.stop()

    def memory_from_here(self) -> None:
        """Reset CUDA's peak counter: what the capture (with the re-sync) adds is measured from here."""
        self._mem = _cuda_memory()

    def capture_memory(self) -> None:
        """The capture's peak over the sync's memory; the checks' are measured from here."""
        if self._mem is not None:
            import torch
            self.t["capture_extra_peak_bytes"] = int(torch.cuda.max_memory_allocated() - self._mem)
            self._mem_checks = _cuda_memory()

    def checks_memory(self, checked: bool) -> None:
        """The checks' peak (when they ran), and over the sync's own memory: the capture's peak, or what it kept
        plus the checks'."""
        if self._mem is None:
            return
        if checked:
            import torch
            self.t["checks_extra_peak_bytes"] = int(torch.cuda.max_memory_allocated() - self._mem_checks)
        self.t["check_extra_peak_bytes"] = max(self.t["capture_extra_peak_bytes"],
                                               self._mem_checks - self._mem + self.t.get("checks_extra_peak_bytes", 0))

    def seconds(self) -> dict:
        return {k: (v if k.endswith("_bytes") else round(v, 4)) for k, v in self.t.items()}


class _GCPauses:
    """Seconds the garbage collector held this process between `start` and `stop` (`gc.callbacks`, any thread): a
    collection of the oldest generation walks every object the process tracks, a trainer's whole heap, and lands
    in whichever timed part allocated last (reported as `capture.gc` and `checks.gc` to say whether that is where
    it went)."""

    def __init__(self):
        self.seconds, self._t0 = 0.0, None

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None

    def start(self) -> "_GCPauses":
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> float:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        return self.seconds


def _cuda_memory():
    """This process's allocated CUDA memory now, with the peak counter reset (None without CUDA in use)."""
    try:
        import torch
        if not torch.cuda.is_initialized():
            return None
        # the allocator's counters are the host's: no synchronize (it would wait here, untimed, for the expected
        # digests the capture began before the install)
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    except Exception:  # noqa: BLE001 - measuring is optional
        return None


__all__ = ["Clock"]
