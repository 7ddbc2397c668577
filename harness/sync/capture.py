"""How the pipeline captures what the rollout engine holds after an install: a strategy, not a second driver.

* `FullRead`: every kernel tensor is read to the host (the CPU reference, snapshots written to disk).
* `DigestFirst`: every engine parameter's streaming state digest (computed where it lives) is compared with the
  digest of what it must hold (`expected_engine_state`: the trainer's bytes through the layout map and the
  engine's *declared* post-load transform); only mismatching parameters move to the host, the others are
  represented by their expected values (bit-identical by the digest). This is what live checks use.

Both return the same thing (a rank-named tensor mapping for the rollout snapshot, and how many parameters were
fetched), and both say which parameters a second install of the same payload changed (the idempotence probe).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..digest import state_digests
from ..bitview import bits_equal
from ..layouts import LayoutError
from ..numerics.expected import expected_engine_state


READ_BATCH_BYTES = 256 << 20     # kernel tensors read back per call when comparing after a re-sync


@dataclass
class Captured:
    tensors: dict            # rank-named -> tensor (host)
    fetched: int             # parameters moved from the engine to the host
    params: int              # parameters the engine holds
    mismatching: list        # DigestFirst: parameters whose digest differed (first 20 kept by callers)
    seconds: dict = field(default_factory=dict)   # where the capture's time went (engine digests, expected, ...)
    # what a correct sync leaves in the engine (rank names), as computed for the comparison; None where it was not
    # (FullRead) or could not be: the checks then compute it themselves (P1's floor reads it: one copy per sync)
    expected: dict | None = None


class FullRead:
    name = "full-read"

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


class DigestFirst:
    name = "digest-first"

    def capture(self, config, rollout, trainer_hf, record) -> Captured:
        t0 = time.perf_counter()
        got = rollout.state_digests()
        t1 = time.perf_counter()
        try:
            held = expected_engine_state(config, trainer_hf, record.post_load)
        except (LayoutError, KeyError, ValueError, RuntimeError):
            held = None             # the trainer's export does not fit the layout: read everything
        expected = held if held is not None else {}
        t2 = time.perf_counter()
        # one batch: on a GPU the expected side's digests cost one host copy, not one per parameter
        want = state_digests({k: expected[k] for k in got if k in expected})
        mismatch = sorted(k for k in got if want.get(k) != got[k])
        t3 = time.perf_counter()
        fetched = rollout.kernel_tensors(mismatch) if mismatch else {}
        # fetched tensors join the expected ones where those live (the trainer's GPU on the device path)
        fetched = {k: (t.to(expected[k].device) if k in expected else t) for k, t in fetched.items()}
        # a mismatching parameter with no bytes (left on the meta device) stays out; the record names it (S1)
        tensors = {k: fetched[k] if k in mismatch else expected[k] for k in got if k not in mismatch or k in fetched}
        seconds = {"engine_digests": t1 - t0, "expected_state": t2 - t1, "expected_digests": t3 - t2,
                   "fetch": time.perf_counter() - t3}
        return Captured(tensors, len(fetched), len(got), mismatch, seconds, held)

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


CAPTURES = {"full-read": FullRead, "digest-first": DigestFirst}

__all__ = ["CAPTURES", "Captured", "DigestFirst", "FullRead", "expected_engine_state"]
