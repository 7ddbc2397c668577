"""Post-load faults: processing skipped, applied twice, or the result written into a detached copy."""
from __future__ import annotations

from .base import Fault, register


def _engine(**attrs):
    def apply(c):
        from harness.engines.cpu.rollout import ReferenceRollout
        eng = ReferenceRollout(c)
        for k, v in attrs.items():
            setattr(eng, k, v)
        return eng
    return apply


register(Fault("postprocess_skipped", "postload", "engine", ("S7",),
               "process_weights_after_loading never runs for the update (a custom loader bypassing the reload hooks)",
               _engine(post_process_repeats=0), silent=True, live=True))
register(Fault("postprocess_twice", "postload", "engine", ("S7",),
               "process_weights_after_loading runs twice per update (non-idempotent under UE8M0 requantization)",
               _engine(post_process_repeats=2), silent=True, live=True))
register(Fault("write_into_detached_copy", "postload", "engine", ("S7", "S1"),
               "the loaded weights land in new tensors; the captured storage (CUDA graphs) keeps the old values",
               _engine(detach_on_install=True), silent=True, live=True))
