"""S3's screens: the conditions S3 judges on every scale grid and FP8 weight of a sync, computed for all of them at
once and handed to the check as flags (harness.bitview), so that S3 reads its findings' evidence only where a flag
is set. Not a check itself: `invariants.sync.s3_scales` reads these.

- `ScaleEncodings`: non-positive or non-finite, not a power of two, the E8M0 NaN byte, over every trainer and wire
  scale (one concatenation per device, the element masks reduced per tensor: `segment_flags`).
- `zero_block_screen`: TE's all-zero-block rule over every FP8 weight (harness.formats.zero_blocks: one launch on a
  GPU).
- `TrainerScreens` / `trainer_screens`: both screens of the trainer's own tensors as host bools, a pure function of
  those tensors, which the pipeline begins beside the install where they are on a GPU (`CheckContext.screens`).

Every screen takes a `ScreenMode` (harness.bitview): the production default defers flags only off the CPU;
`ScreenMode.DEFERRED` takes the GPU's path on CPU tensors too, with the same results after `resolve`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fp8check.harness.kinds import Granularity, Quantization, ScaleFormat
from fp8check.harness.layouts import scale_name

from .base import CheckContext

if TYPE_CHECKING:     # torch is imported in the screens that compute: pre-flight imports this without it
    from fp8check.harness.bitview import ScreenMode

__all__ = ["ScaleEncodings", "TrainerScreens", "segment_flags", "trainer_screens", "zero_block_screen"]


def _mode(mode: "ScreenMode | None") -> "ScreenMode":
    """None is the production mode (`ScreenMode.BY_DEVICE`): the checks' signatures stay importable without torch."""
    from fp8check.harness.bitview import ScreenMode
    return ScreenMode.BY_DEVICE if mode is None else mode


class ScaleEncodings:
    """S3's encoding screens (non-positive or non-finite, not a power of two, the E8M0 NaN byte) over every trainer
    and wire scale of a sync at once: the scale grids (small next to the codes) read as one concatenation per
    device and the element masks reduced per tensor, a few launches in all instead of several per tensor. Flags as
    `harness.bitview.flag` gives them under `mode`. A trainer scale `ahead` (TrainerScreens) screened already is
    not read again; a wire scale the sync's digests show equal to the trainer's takes the trainer's flags."""

    def __init__(self, ctx: CheckContext, recipe, ahead: "TrainerScreens | None" = None,
                 mode: "ScreenMode | None" = None):
        from fp8check.harness.formats import E8M0
        self.e8m0 = recipe.scale_format == ScaleFormat.E8M0
        wire = ctx.payload if ctx.payload is not None and ctx.config.fp8_on_wire else None
        verified = ctx.wire_verified if wire is not None else frozenset()
        tensors, self._alias, self._ahead = [], {}, {}
        for n in ctx.config.fp8_tensor_names:
            sn = scale_name(n)
            t = ctx.trainer.get(sn)
            t = t if t is not None and (not self.e8m0 or t.dtype == E8M0) else None
            done = ahead.encodings_of(t) if ahead is not None and t is not None else None
            if done is not None:
                self._ahead[id(t)] = done
            elif t is not None:
                tensors.append(t)
            w = wire.get(sn) if wire is not None else None
            if w is not None and (not self.e8m0 or w.dtype == E8M0):
                if t is not None and sn in verified:     # the trainer's bytes (the sync's digests say): its flags
                    self._alias[id(w)] = id(t)
                else:
                    tensors.append(w)
        self._flags = segment_flags(tensors, self._masks, mode)
        self._index = {id(t): i for i, t in enumerate(tensors)}

    def _masks(self, flat):
        import torch
        from fp8check.harness.formats import is_pow2
        if self.e8m0:
            return [flat.view(torch.uint8) == 0xFF]
        v = flat.float()
        return [~(torch.isfinite(v) & (v > 0)), ~is_pow2(v)]

    @property
    def masks(self) -> int:
        return len(self._flags)

    def read(self, s) -> list | None:
        """The flags (one per mask) of a scale this screen read itself; None for one it did not read (absent, taken
        from `ahead`, or a wire scale aliased to the trainer's)."""
        i = self._index.get(id(s))
        return None if i is None else [f[i] for f in self._flags]

    def _get(self, s, k):
        key = self._alias.get(id(s), id(s))
        done = self._ahead.get(key)
        return done[k] if done is not None else self._flags[k][self._index[key]]

    def e8m0_nan(self, s):
        return self._get(s, 0)

    def non_positive(self, s):
        return self._get(s, 0)

    def not_pow2(self, s):
        """Judged only where every scale of the tensor is finite and positive (else `non_positive` says why)."""
        return self._get(s, 1)


def zero_block_screen(ctx: CheckContext, recipe, ahead: "TrainerScreens | None" = None,
                      mode: "ScreenMode | None" = None) -> dict:
    """FP8 weight -> whether some all-zero block of the trainer's codes has a scale_inv other than 1 (TE's rule),
    for every weight the rule applies to, screened at once (`harness.formats.zero_blocks`: one launch on a GPU),
    flags under `mode`; a weight `ahead` screened already is not read again."""
    from fp8check.harness.bitview import FlagOf, flag
    from fp8check.harness.formats.zero_blocks import zero_block_flags
    if (recipe.granularity != Granularity.BLOCK or recipe.amax_epsilon != 0
            or ctx.config.rollout.quantization != Quantization.CHECKPOINT):
        return {}
    mode = _mode(mode)
    names, out = [], {}
    for n in ctx.config.fp8_tensor_names:
        codes, t = ctx.trainer.get(n), ctx.trainer.get(scale_name(n))
        if codes is not None and t is not None and codes.dim() == 2 and codes.element_size() == 1 \
                and tuple(t.shape) == recipe.scale_grid(codes.shape):
            done = ahead.zero_block_of(n, codes, t) if ahead is not None else None
            if done is not None:
                out[n] = done
            else:
                names.append(n)
    flags = zero_block_flags([(ctx.trainer[n], ctx.trainer[scale_name(n)]) for n in names], recipe.block_shape,
                             flag_of=FlagOf) if names else []
    out.update({n: flag(f, mode) for n, f in zip(names, flags)})
    return out


class TrainerScreens:
    """S3's screens of the trainer's own tensors -- its scales' encodings, TE's zero-block rule -- as host bools
    (`trainer_screens`): a pure function of those tensors, which the pipeline computes ahead, during the install,
    where they are on a GPU (`CheckContext.screens`). S3 takes a result only for the very tensor object it was
    computed from, at the same version counter and under the same config; any other tensor it screens itself."""

    def __init__(self, config, encodings: dict, zero_blocks: dict):
        self.config = config
        self._encodings = encodings        # id(scale) -> (scale, version, [bool per mask])
        self._zero_blocks = zero_blocks    # weight name -> (codes, scale, versions, bool)

    def encodings_of(self, t) -> list | None:
        hit = self._encodings.get(id(t))
        return hit[2] if hit is not None and hit[0] is t and hit[1] == t._version else None

    def zero_block_of(self, name: str, codes, scale) -> bool | None:
        hit = self._zero_blocks.get(name)
        if hit is None or hit[0] is not codes or hit[1] is not scale or hit[2] != (codes._version, scale._version):
            return None
        return hit[3]


def trainer_screens(config, trainer_hf, mode: "ScreenMode | None" = None) -> TrainerScreens:
    """`TrainerScreens` of these trainer tensors (the FP8 weights' codes and scales), every flag on the host: one
    copy per screen's vector. `mode` changes only how the flags reach the host, never the bools."""
    from fp8check.harness.bitview import resolve
    from fp8check.harness.snapshot import Snapshot
    ctx = CheckContext(config, trainer=Snapshot("trainer", dict(trainer_hf)))
    recipe = config.recipe
    enc = ScaleEncodings(ctx, recipe, mode=mode)
    zb = zero_block_screen(ctx, recipe, mode=mode)
    read = [(t, enc.read(t)) for t in (ctx.trainer.get(scale_name(n)) for n in config.fp8_tensor_names)
            if t is not None]
    read = [(t, f) for t, f in read if f is not None]
    scales, masks = [t for t, _ in read], enc.masks
    flags = resolve([f for _, fs in read for f in fs] + list(zb.values()))
    encodings = {id(t): (t, t._version, flags[i * masks:(i + 1) * masks]) for i, t in enumerate(scales)}
    rest = flags[len(scales) * masks:]
    zero_blocks = {n: (ctx.trainer[n], ctx.trainer[scale_name(n)],
                       (ctx.trainer[n]._version, ctx.trainer[scale_name(n)]._version), f)
                   for n, f in zip(zb, rest)}
    return TrainerScreens(config, encodings, zero_blocks)


def segment_flags(tensors: list, masks, mode: "ScreenMode | None" = None) -> list[list]:
    """For each element mask `masks(flat)` gives (a list of them over one concatenation of `tensors`), whether any
    element of each tensor is set: [[flag per tensor] per mask]; the second mask only where the first is clear
    (the flags of a tensor: `any(m0)`, `any(m1) and not any(m0)`, ...). One concatenation, one reduction per
    mask, per device. A device `mode` defers on gives `FlagOf`s of one vector per mask; another gives bools."""
    import torch
    from fp8check.harness.bitview import FlagOf
    mode = _mode(mode)
    out: list | None = None
    by_device: dict = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for dev, ix in by_device.items():
        parts = [tensors[i].reshape(-1) for i in ix]
        dtypes = {p.dtype for p in parts}
        flat = torch.cat(parts) if len(dtypes) == 1 else torch.cat([p.float() for p in parts])
        sizes = torch.tensor([p.numel() for p in parts], device=dev)
        seg = torch.repeat_interleave(torch.arange(len(ix), device=dev), sizes, output_size=flat.numel())
        hits, seen = [], None
        for m in masks(flat):
            h = torch.zeros(len(ix), dtype=torch.int32, device=dev).index_add_(0, seg, m.to(torch.int32)) > 0
            hits.append(h if seen is None else h & ~seen)
            seen = h if seen is None else seen | h
        rows = [[FlagOf(h, k) for k in range(len(ix))] if mode.defers(h.device) else h.tolist() for h in hits]
        if out is None:
            out = [[False] * len(tensors) for _ in rows]
        for k, row in enumerate(rows):
            for i, v in zip(ix, row):
                out[k][i] = v
    return out if out is not None else []          # no tensor: nothing to look up
