"""Version faults: one layer from step N-1 (stamped or not), generation during a sync."""
from __future__ import annotations

from dataclasses import replace as dc_replace

from fp8check.harness.sync.payload import tensor_digest

from .base import Fault, NoTarget, register


def _stale_layer(stamp: bool):
    def apply(c, p, ctx, layer=0):
        prev = ctx.previous
        if prev is None:
            raise NoTarget("no previous step")
        pre = c.spec.layer_prefix(layer)
        recs, tensors = [], dict(p.tensors)
        for r in p.records:
            if r.name.startswith(pre):
                t = prev[r.name]
                if c.sync_mode == "naive" and r.role == "hp" and t.dtype != tensors[r.name].dtype:
                    t = t.to(tensors[r.name].dtype)
                tensors[r.name] = t
                r = dc_replace(r, digest=tensor_digest(t), version=r.version - 1 if stamp else r.version)
            recs.append(r)
        return type(p)(recs, tensors, p.version)
    return apply


register(Fault("stale_layer_stamped", "version", "payload", ("S7", "S2", "S3", "S4"),
               "one layer's tensors come from step N-1 (its records say so)", _stale_layer(True), silent=True))
register(Fault("stale_layer_unstamped", "version", "payload", ("S2", "S3", "S4"),
               "one layer's tensors come from step N-1 under step N's version stamp", _stale_layer(False),
               silent=True))


register(Fault("generation_during_sync", "version", "engine", ("S7",),
               "a generation request served while the update is half installed (the sampler was not paused)",
               knobs={"generate_during_update": 10}, silent=True))


def _stale_workspace(c, hf, ctx):
    """The learner's FP8 workspaces still hold the previous step's codes and scales; its BF16 tensors are current."""
    prev = ctx.previous
    if prev is None:
        raise NoTarget("no previous step")
    for n in list(hf):
        if n in c.fp8_tensors or (n.endswith("_scale_inv") and n[: -len("_scale_inv")] in c.fp8_tensors):
            hf[n] = prev[n]
    return hf


# Transformer Engine caches each weight's FP8 copy and refreshes it on the first micro-batch of a step
# (`is_first_microbatch`); a loop that never passes True keeps the old copy. The sync faithfully carries what the
# learner runs, so only C1 -- the learner's bytes against its own masters -- sees the learner is stale.
register(Fault("trainer_fp8_workspace_stale", "version", "trainer", ("C1",),
               "the learner's FP8 weight workspaces are not refreshed after the optimizer step: it runs the previous "
               "step's codes and scales with the current masters", _stale_workspace, silent=True))
