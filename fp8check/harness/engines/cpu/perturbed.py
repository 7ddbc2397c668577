"""fp8check's own CPU rollout engine: the reference mirror (cpu/rollout.py) plus the engine-stage fault knobs
(`harness.engines.protocol.KNOBS`), as fp8check's own vLLM engines carry `FP8CheckTestExtension` on top of the
user-facing extension. Each knob overrides one of the mirror's load-path steps with the broken behaviour it names,
for one install; with no knob turned every step is the mirror's own.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from ...layouts import Piece
from ...record import UpdateRecord
from .rollout import ReferenceRollout
from .serving import attention_layers, rotary_buffer


class PerturbableRollout(ReferenceRollout):
    """The CPU reference rollout with the fault knobs: `install(..., knobs=)` turns them for that install."""
    DEFAULT_KNOBS = {"post_process_repeats": 1, "detach_on_install": False, "generate_during_update": None,
                     "kv_scale_placeholder": None, "realloc_buffer": False, "keep_prefix_cache": False,
                     "logit_scale": None, "shard_offsets_lost": False, "packed_scales_copied": False}
    knobs = frozenset(DEFAULT_KNOBS)

    def __init__(self, config, **kwargs):
        self._knobs = dict(self.DEFAULT_KNOBS)              # engine-stage faults set these for one install
        super().__init__(config, **kwargs)

    @contextmanager
    def _with_knobs(self, knobs: dict | None):
        self._refuse_knobs(knobs)
        self._knobs = {**self.DEFAULT_KNOBS, **(knobs or {})}
        try:
            yield
        finally:
            self._knobs = dict(self.DEFAULT_KNOBS)

    def install(self, items, version: int | None = None, *, direct: bool = False, knobs: dict | None = None):
        """The mirror's install with `knobs` turned for its duration (an unknown one is refused)."""
        with self._with_knobs(knobs):
            return super().install(items, version, direct=direct, knobs=knobs)

    def _fused(self, dst: str, rank: int) -> bool:
        """Several checkpoint tensors load into this parameter (q|k|v, gate|up: one stacked buffer)."""
        w = dst.removesuffix("_scale_inv")
        return sum(1 for p in self.layout.vllm[rank] if p.dst == w) > 1

    # -- the knobs, one load-path step each --------------------------------------------------------------------------
    def _while_loading(self, loads: int):
        if loads == self._knobs["generate_during_update"]:  # a scheduler that was not paused
            self._serve_generation([[1, 2, 3, 4]])

    def _shard_offset(self, piece: Piece, rank: int) -> Piece:
        if self._knobs["shard_offsets_lost"] and self._fused(piece.dst, rank):
            return replace(piece, dst_row=0)                 # every shard lands at the buffer's start
        return piece

    def _post_load_runs(self, record: UpdateRecord | None) -> int:
        # the start-up post-load (no record) is never perturbed
        return self._knobs["post_process_repeats"] if record is not None else 1

    def _kernel_scales(self, scales: torch.Tensor, record: UpdateRecord | None) -> torch.Tensor:
        if record is not None and self._knobs["packed_scales_copied"] and scales.dim() >= 2:
            # the kernel reads the grid MN-major; a copy_ of the checkpoint layout's bytes lands transposed
            nb, kb = scales.shape[-2:]
            return scales.reshape(*scales.shape[:-2], kb, nb).transpose(-1, -2).contiguous()
        return scales

    def _write_into(self, rank: int, name: str, t: torch.Tensor):
        if self._knobs["detach_on_install"]:                 # a write into a fresh tensor, not the captured storage
            self.params[rank][name] = t.to(self.params[rank][name].dtype).clone()
        else:
            super()._write_into(rank, name, t)

    def _after_reload(self):
        knobs = self._knobs
        if knobs["kv_scale_placeholder"] is not None:        # a reload that re-created the scale sentinel
            layer = attention_layers(self.config.spec)[0]
            self.buffers[0][f"{layer}._k_scale"].fill_(float(knobs["kv_scale_placeholder"]))
        if knobs["realloc_buffer"]:                          # a buffer rebound to new storage
            rot = rotary_buffer(self.config.spec)
            self.buffers[0][rot] = self.buffers[0][rot].clone()
        kept = dict(self._prefix_cache) if knobs["keep_prefix_cache"] else {}
        super()._after_reload()
        self._prefix_cache.update(kept)                      # a stale cache served after the sync
        if knobs["logit_scale"] is not None:
            # the sampler's logits scaled (a temperature applied to the log-probs it returns); the next install resets it
            self.logit_scale = float(knobs["logit_scale"])


__all__ = ["PerturbableRollout"]
