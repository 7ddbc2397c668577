"""Post-load faults: processing skipped, applied twice, or the result written into a detached copy. Each is a
knob a running engine is told to turn for one install (harness.engines.protocol.KNOBS)."""
from __future__ import annotations

from .base import Fault, register

register(Fault("postprocess_skipped", "postload", "engine", ("S7",),
               "process_weights_after_loading never runs for the update (a custom loader bypassing the reload hooks)",
               knobs={"post_process_repeats": 0}, silent=True, may=("S2", "S3")))   # bytes differ where post-load rewrites
register(Fault("postprocess_twice", "postload", "engine", ("S7",),
               "process_weights_after_loading runs twice per update (non-idempotent under UE8M0 requantization)",
               knobs={"post_process_repeats": 2}, silent=True))
# what the kernels read then depends on how the engine serves: captured graphs (and the CPU mirror, which always
# serves the captured storage) read the old bytes (S1-S4); eager vLLM reads the new tensors, so only the moved
# storage shows (S7; on the H200, 2026-12-01)
register(Fault("write_into_detached_copy", "postload", "engine", ("S7",),
               "the loaded weights land in new tensors; the captured storage (CUDA graphs) keeps the old values",
               knobs={"detach_on_install": True}, silent=True, destructive=True,   # the storage stays detached
               may=("S1", "S2", "S3", "S4")))

# modal-projects/stitch#16 (its first half: the per-tensor requantization it also skipped is not modelled here)
register(Fault("fused_shards_clobbered", "postload", "engine", ("S1", "S2", "S3", "S4"),
               "the reload's staging buffer for a fused parameter is uninitialised and every q/k/v (gate/up) shard is "
               "written at its start: the shards clobber each other, the rest of the buffer is served as it was",
               knobs={"shard_offsets_lost": True}, silent=True, may=("S7",)))
# NVIDIA-NeMo/RL#2081
register(Fault("packed_scales_copied_raw", "postload", "engine", ("S3", "S4"),
               "a patched post-process copy_s the checkpoint-layout scale grid into the scale tensor the kernel reads "
               "MN-major (DeepGEMM's packed layout): every block reads another block's scale", 
               knobs={"packed_scales_copied": True}, silent=True, may=("S2",)))
