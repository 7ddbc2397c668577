"""How the pipeline captures what the rollout engine holds after an install: a strategy, not a second driver.

* `FullRead`: every kernel tensor is read to the host (the CPU reference, snapshots written to disk).
* `DigestFirst`: every engine parameter's streaming state digest (computed where it lives) is compared with the
  digest of what it must hold (`ExpectedState`: the trainer's bytes through the layout map and the engine's
  *declared* post-load transform, digested from the trainer's tensors where they lie, at their offsets in the
  fused parameter, without building it); only mismatching parameters move to the host, the others are
  represented by their expected values (bit-identical by the digest), made only where a check reads one. The
  snapshot says which (`Snapshot.proof`): the checks then compare those in checkpoint coordinates as the
  trainer's own tensors (`CheckContext.rollout_hf`), a comparison that reads nothing. This is what live checks
  use.

Both return the same thing (a rank-named tensor mapping for the rollout snapshot, and how many parameters were
fetched), and both say which parameters a second install of the same payload changed (the idempotence probe).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from ..bitview import bits_equal
from ..engines.remote import Done, offers, start_call
from ..layouts import LayoutError
from ..lazy import LazyMap
from ..numerics.expected import ExpectedState, expected_engine_state
from ..record import DigestProof


READ_BATCH_BYTES = 256 << 20     # kernel tensors read back per call when comparing after a re-sync


@dataclass
class Captured:
    tensors: dict            # rank-named -> tensor (host)
    fetched: int             # parameters moved from the engine to the host
    params: int              # parameters the engine holds
    mismatching: list        # DigestFirst: parameters whose digest differed (first 20 kept by callers)
    seconds: dict = field(default_factory=dict)   # where the capture's time went (engine digests, expected, ...)
    proof: DigestProof | None = None              # DigestFirst: the parameters its digests proved (Snapshot)
    specs: dict | None = None                     # name -> (shape, dtype) of tensors held lazily (Snapshot.specs)


class FullRead:
    name = "full-read"

    def begin(self, config, trainer_hf: dict, poisoned: bool, on_cpu: bool = False) -> None:
        """Nothing to start before the install: everything is read after it."""

    def start_record(self, rollout):
        """The engine's record started (`.result()` waits for it); nothing to read beside it."""
        return start_call(rollout, "record")

    def capture(self, config, rollout, trainer_hf, record) -> Captured:
        t = rollout.kernel_tensors()
        return Captured(t, len(t), len(t), [])

    def fingerprint(self, rollout) -> dict:
        return rollout.kernel_tensors()

    @staticmethod
    def same(a, b) -> bool:
        return b is not None and bits_equal(a, b)

    def before_resync(self, rollout, got: Captured) -> dict:
        return got.tensors

    def changed(self, rollout, before: dict) -> list[str]:
        """Parameters whose bytes differ from `before`, read back a few at a time (at real shapes a second full
        copy of the engine state would double the host memory)."""
        # an in-process engine may lend views (compared here at once); others copy to the host
        views = callable(getattr(type(rollout), "kernel_views", None))
        read = rollout.kernel_views if views else rollout.kernel_tensors
        out, batch, size = [], [], 0
        names = list(before)
        for i, n in enumerate(names):
            batch.append(n)
            size += before[n].numel() * before[n].element_size()
            if size >= READ_BATCH_BYTES or i == len(names) - 1:
                after = read(batch)
                out += [k for k in batch if not self.same(before[k], after.get(k))]
                batch, size = [], 0
        return sorted(out)


class _Ahead:
    """The expected side of one sync's capture, started before the install (`DigestFirst.begin`): the digests of
    what a correct sync leaves in every parameter *if the engine's declared transform leaves it alone* -- the
    trainer's bytes through the layout map, known before the engine is touched. Which parameters the transform
    rewrites is the engine record's to say, read after the install; the capture recomputes those.

    With the trainer's tensors on a GPU the digests run in a thread on their own CUDA stream, ordered after
    everything the caller had enqueued (the export): on the device path the install is an RPC to the engine's
    process, during which this process's host only waits (the GIL is free) and its GPU is idle but for the
    install's own copies. Elsewhere (CPU tensors: the reference engines install in this process, Python against
    Python) the same digests are computed when the capture asks for them."""

    def __init__(self, config, trainer_hf: dict, sentinels: bool, on_cpu: bool = False):
        self.trainer_hf, self.sentinels = trainer_hf, sentinels
        self.state = ExpectedState(config, trainer_hf, None)
        self.seconds = None
        self._future = start_ahead(self._run, trainer_hf, on_cpu=on_cpu)

    def _run(self) -> dict:
        t0 = time.perf_counter()
        out = self.state.digests(list(self.state), sentinels=self.sentinels)
        self.seconds = time.perf_counter() - t0
        return out

    def result(self) -> dict:
        return self._future.result() if self._future is not None else self._run()


def start_ahead(fn, trainer_hf: dict, on_cpu: bool = False):
    """`fn()` begun beside the install (a `Future`), where the trainer's tensors are on a GPU: in the one background
    thread, on its own CUDA stream, ordered after everything the caller had enqueued (the export). None elsewhere:
    the caller computes it when it needs it; `on_cpu`: in the thread too, without a stream (what the GPU path does,
    for tests on CPU tensors). Inside `ahead_held()` the work starts when the block ends."""
    device = next((t.device for t in trainer_hf.values()), None)
    if device is not None and device.type == "cuda":
        import torch
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))        # after the export's kernels

        def on_stream():
            _OPEN.wait()
            with torch.cuda.stream(stream):
                return fn()
        return _pool().submit(on_stream)
    if on_cpu:
        def held():
            _OPEN.wait()
            return fn()
        return _pool().submit(held)
    return None


_OPEN = threading.Event()
_OPEN.set()


@contextlib.contextmanager
def ahead_held():
    """Work begun with `start_ahead` inside the block starts when it ends, also when the block raises. Nothing
    inside the block may wait for that work."""
    # started at once, the background thread would hold the interpreter while the caller makes its next hand-offs
    # (each then waits up to the switch interval); after the block the caller only waits for the engine
    _OPEN.clear()
    try:
        yield
    finally:
        _OPEN.set()


_POOL = []


def _pool():
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="fp8check-expected"))
    return _POOL[0]


class _RecordAndDigests:
    """`record_and_digests` started: the record for the pipeline, the digests kept for the capture."""

    def __init__(self, capture: "DigestFirst", pending):
        self._capture, self._pending = capture, pending

    reply_seconds = property(lambda self: self._pending.reply_seconds)

    def result(self):
        record, digests = self._pending.result()
        self._capture._digesting = Done(digests)
        return record


class DigestFirst:
    name = "digest-first"

    def __init__(self):
        self._ahead: _Ahead | None = None
        self._digesting = None             # the engine's digests, started with its record (`start_record`)

    def begin(self, config, trainer_hf: dict, poisoned: bool, on_cpu: bool = False) -> None:
        """The pipeline's call as the install starts: start the expected digests (`_Ahead`; `on_cpu`: in the
        background thread on CPU tensors too)."""
        try:
            self._ahead = _Ahead(config, trainer_hf, poisoned, on_cpu)
        except (LayoutError, KeyError, ValueError, RuntimeError):
            self._ahead = None              # the capture derives it again and says why not

    def start_record(self, rollout):
        """The pipeline's call once the install is started (an engine in its own process: the call queued behind
        it) or done: the engine's record and its digests started, in one call where
        the engine offers one (`record_and_digests`), else the digests behind the record (a remote engine runs
        both, in order, for one wait). `.result()` gives the record; the capture takes the digests."""
        self._digesting = None              # nothing of an earlier sync is read in this one
        if offers(rollout, "record_and_digests"):
            return _RecordAndDigests(self, start_call(rollout, "record_and_digests"))
        recording = start_call(rollout, "record")
        self._digesting = start_call(rollout, "state_digests")
        return recording

    def _ahead_digests(self, trainer_hf, sentinels: bool) -> tuple[dict, float | None]:
        """The digests `begin` started for these trainer tensors ({} where it did not, or they failed)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead.trainer_hf is not trainer_hf or ahead.sentinels != sentinels:
            return {}, None
        try:
            return ahead.result(), ahead.seconds
        except (LayoutError, KeyError, ValueError, RuntimeError):
            return {}, ahead.seconds

    def capture(self, config, rollout, trainer_hf, record) -> Captured:
        t0 = time.perf_counter()
        digesting, self._digesting = self._digesting, None
        got = digesting.result() if digesting is not None else rollout.state_digests()
        t1 = time.perf_counter()
        # what a correct sync leaves there, described from the trainer's tensors (digested where they lie, nothing
        # built but a parameter the declared transform rewrites); one batch: on a GPU one host copy in all
        ahead_s = None
        try:
            expected = ExpectedState(config, trainer_hf, record.post_load)
            names = [k for k in got if k in expected]
            ahead, ahead_s = self._ahead_digests(trainer_hf, record.poisoned)
            # begun before the install with no transform: valid for every parameter the declared one leaves alone
            want = {k: ahead[k] for k in names if k in ahead and not expected.transformed(k)}
            want.update(expected.digests([k for k in names if k not in want], sentinels=record.poisoned))
        except (LayoutError, KeyError, ValueError, RuntimeError):
            expected, want = {}, {}         # the layout itself cannot be built: read everything
        mismatch = sorted(k for k in got if want.get(k, (None,))[0] != got[k])
        t2 = time.perf_counter()
        fetched = rollout.kernel_tensors(mismatch) if mismatch else {}
        # fetched tensors join the expected ones where those live (the trainer's GPU on the device path)
        device = next((t.device for t in trainer_hf.values()), None)
        fetched = {k: t.to(device) if device is not None else t for k, t in fetched.items()}
        matched = [k for k in got if k not in mismatch]
        # a mismatching parameter with no bytes (left on the meta device) stays out; the record names it (S1)
        names = [k for k in got if k in fetched or k not in mismatch]
        tensors = LazyMap(names, lambda k: fetched[k] if k in fetched else expected[k])
        specs = {k: _spec(got[k]) for k in matched}
        proof = DigestProof(matched, [k for k in matched if want[k][1]])
        seconds = {"engine_digests": t1 - t0, "expected_digests": t2 - t1, "fetch": time.perf_counter() - t2}
        if ahead_s is not None:             # the expected digests' own time, overlapping the install
            seconds["expected_ahead"] = ahead_s
        return Captured(tensors, len(fetched), len(got), mismatch, seconds, proof=proof, specs=specs)

    def fingerprint(self, rollout) -> dict:
        return rollout.state_digests()

    @staticmethod
    def same(a, b) -> bool:
        return a == b

    def before_resync(self, rollout, got: Captured) -> dict:
        return self.fingerprint(rollout)

    def changed(self, rollout, before: dict) -> list[str]:
        after = self.fingerprint(rollout)
        return sorted(n for n, v in before.items() if not self.same(v, after.get(n)))


def _spec(digest: str) -> tuple[tuple, object]:
    """(shape, dtype) a digest string names ("fx:bfloat16:4x8:..."): a proven parameter's, without building it."""
    import torch
    _, dtype, shape = digest.split(":")[:3]
    return (() if shape == "scalar" else tuple(int(d) for d in shape.split("x"))), getattr(torch, dtype)


CAPTURES = {"full-read": FullRead, "digest-first": DigestFirst}

__all__ = ["CAPTURES", "Captured", "DigestFirst", "FullRead", "ahead_held", "expected_engine_state", "start_ahead"]
