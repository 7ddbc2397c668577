"""What a rollout engine must hold after a correct sync, derived from the trainer's bytes alone: the layout map
(fusion, TP narrowing) applied, then the engine's *declared* post-load transform. The digest-first capture
compares every engine parameter with it, and the policy probe (P1) runs the reference forward over it: a
perfect sync's engine, built without reading the engine.

`ExpectedState` describes that state without building it: a parameter the declared transform leaves alone is the
trainer's checkpoint tensors at byte offsets (`harness.digest.Assembled`), digested where they lie; a fused
parameter is built only when something reads it, one at a time (at Qwen3-8B x 12 layers the fused q|k|v and
gate|up copies were 2.2 GB, 46 % of the payload, held through the catalog)."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ..digest import Assembled, assembled_digests
from ..layouts import (LayoutError, dst_view, is_scale_name, rank_name, scale_name, split_rank_name, src_view,
                       weight_of_scale)
from .transforms import apply_post_load


def _geometry(layout, rank: int) -> dict:
    """Engine parameter on `rank` -> (its pieces, its shape, the FP8 weight it belongs to or None, per piece (the
    element offset of the rows it fills, or None where they are not one contiguous range; those rows' shape)):
    pure data of the layout map, made once per map (a sync only looks its trainer tensors up)."""
    cache = layout.__dict__.setdefault("_expected_geometry", {})
    if rank not in cache:
        shapes = layout.vllm_param_shapes(rank)
        by_dst: dict[str, list] = {}
        for p in layout.vllm_load_pieces(rank):
            by_dst.setdefault(p.dst, []).append(p)
        out = {}
        for n, ps in by_dst.items():
            # a parameter with a scale is FP8 (codes and scale go through the transform together)
            w = n if scale_name(n) in by_dst else (weight_of_scale(n) if is_scale_name(n) else None)
            whole = torch.empty(tuple(shapes[n]), device="meta")
            where = []
            for p in ps:
                d = dst_view(whole, p)
                where.append((d.storage_offset() if d.is_contiguous() else None, tuple(d.shape)))
            out[n] = (ps, tuple(shapes[n]), w, where)
        cache[rank] = out
    return cache[rank]


class ExpectedState(Mapping):
    """Rank-named engine parameter -> what it must hold (a fresh tensor on every read: nothing is kept).
    `errors` names the parameters that cannot be derived from the trainer's tensors (missing, misshapen: the
    layout map's own error), which a capture then reads from the engine."""

    def __init__(self, config, trainer_hf: dict, post_load):
        if config.split_tensors:
            trainer_hf = {**trainer_hf, **split_members_served(config, trainer_hf)}
        self.config, self.trainer_hf, self.post_load = config, trainer_hf, post_load
        self.errors: dict[str, str] = {}
        self._pieces: dict[str, tuple] = {}       # name -> (rank, pieces, shape, fp8 weight or None, where)
        tp = config.rollout.tp_size
        for r in range(tp):
            for n, (ps, shape, w, where) in _geometry(config.layout, r).items():
                self._pieces[rank_name(n, r, tp)] = (r, ps, shape, w, where)
        self._names = list(self._pieces)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._pieces

    def _hp_dtype(self, name: str) -> torch.dtype:
        """The dtype the engine holds a high-precision parameter in."""
        return getattr(torch, self.config.layout.engine_dtype(split_rank_name(name)[1]))

    def transformed(self, name: str) -> bool:
        r, _, _, w, _ = self._pieces[name]
        if w is None:
            return False
        pl = self.post_load
        key = rank_name(w, r, self.config.rollout.tp_size)
        return pl is not None and pl.kind != "identity" and key in pl.params

    def _assemble(self, name: str) -> torch.Tensor:
        from ..layouts import assemble
        _, ps, shape, _, _ = self._pieces[name]
        dst = ps[0].dst
        return assemble(ps, self.trainer_hf, {dst: shape})[dst]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._pieces:
            raise KeyError(name)
        r, _, _, w, _ = self._pieces[name]
        if w is None:
            return self._assemble(name).to(self._hp_dtype(name))
        tp = self.config.rollout.tp_size
        wkey, skey = rank_name(w, r, tp), rank_name(scale_name(w), r, tp)
        q, s, _ = apply_post_load(self.post_load, wkey, self._assemble(wkey), self._assemble(skey))
        return q if name == wkey else s

    def described(self, name: str) -> Assembled | None:
        """The parameter as the trainer's tensors at byte offsets, where its bytes are exactly those (no transform,
        every piece of one dtype and a contiguous range); None where it must be built to be known."""
        _, ps, shape, w, where = self._pieces[name]
        if self.transformed(name):
            return None
        hf = self.trainer_hf
        if any(p.src not in hf for p in ps):
            return None
        # the dtype `assemble` gives it (its first source's; high precision is held as BF16, or float32 where the
        # engine holds it so: then built, the exact cast of the trainer's BF16)
        dtype = hf[ps[0].src].dtype if w is not None else self._hp_dtype(name)
        out = []
        for p, (off, rows) in zip(ps, where):
            src = hf[p.src]
            v = src_view(src, p)
            if off is None or src.dtype != dtype or tuple(v.shape) != rows:
                return None
            out.append((v, off * dtype.itemsize))
        return Assembled(shape, dtype, hf[ps[0].src].device, tuple(out))

    def digests(self, names, sentinels: bool = False) -> dict:
        """{name: (digest, sentinel flag)} for the parameters in `names` that can be derived (the others land in
        `errors`): described ones from the trainer's tensors where they lie, the rest built one batch at a time."""
        targets, built, out = {}, {}, {}
        for n in names:
            if n not in self._pieces:
                continue
            a = self.described(n)
            if a is not None:
                targets[n] = a
                continue
            try:
                t = self[n]
            except (LayoutError, KeyError, ValueError, RuntimeError, IndexError) as e:
                self.errors[n] = f"{e.__class__.__name__}: {e}"
                continue
            built[n] = Assembled(tuple(t.shape), t.dtype, t.device, ((t, 0),))
            if sum(a.nbytes for a in built.values()) >= BUILT_BYTES:      # a bounded number of built bytes at once
                out.update(assembled_digests(built, sentinels))
                built = {}
        out.update(assembled_digests({**targets, **built}, sentinels))
        return out


BUILT_BYTES = 256 << 20


def split_members_served(config, trainer_hf) -> dict[str, torch.Tensor]:
    """The members of a split fused GEMM (`SyncConfig.split_tensors`: FP8 in the trainer, high precision in the
    engine) as the engine serves them after a sync that sends the trainer's own values: its FP8 forward
    dequantized, in BF16 (fp8check's own sync sends that; what a user's sends is judged as sent). Members the
    trainer's tensors lack (or hold without a scale) are left out."""
    out = {}
    for n in config.split_tensors:
        t, s = trainer_hf.get(n), trainer_hf.get(scale_name(n))
        if t is not None and s is not None and t.element_size() == 1:
            out[n] = config.trainer_recipe.dequantize_weight(t, s).to(torch.bfloat16)
    return out


def expected_engine_state(config, trainer_hf: dict, post_load) -> dict[str, torch.Tensor]:
    """vLLM names (rank-named when sharded) -> what the parameter must hold after a correct sync of
    `trainer_hf`, built (LayoutError where the trainer's tensors do not fit the layout)."""
    state = ExpectedState(config, trainer_hf, post_load)
    return {n: state[n] for n in state}
