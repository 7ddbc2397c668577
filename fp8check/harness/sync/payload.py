"""Payload: what one weight sync sends. An ordered manifest of TensorRecords plus the tensors, in vLLM
checkpoint convention (`*.weight` FP8 codes, `*.weight_scale_inv` scales with dequant = q * scale_inv,
excluded tensors BF16)."""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, replace

import torch

from ..config import SyncConfig
from ..formats.bytes import as_bytes
from ..layouts import is_scale_name, scale_name, weight_of_scale

ROLE_FP8, ROLE_SCALE, ROLE_HP, ROLE_KV = "fp8", "scale", "hp", "kv_scale"
ROLES = (ROLE_FP8, ROLE_SCALE, ROLE_HP, ROLE_KV)


class PayloadError(ValueError):
    """A payload or manifest is malformed."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise PayloadError(f"unknown dtype {name!r}")
    return dt


def tensor_bytes(t: torch.Tensor) -> bytes:
    return as_bytes(t.cpu()).numpy().tobytes()


def byte_view(t: torch.Tensor):
    """The tensor's raw bytes as a flat uint8 numpy array over its storage (no copy when it is contiguous): what
    hashing and bucket packing read, without materializing a `bytes` copy of a gigabyte embedding."""
    return as_bytes(t.cpu()).numpy()


def tensor_digest(t: torch.Tensor) -> str:
    """The wire digest of a tensor, algorithm-tagged: `b2:` blake2b-128 over dtype, shape and the raw bytes for a
    host tensor; `fx:` the streaming state digest (harness.digest) for a device tensor, computed where it lives.
    Equal digests <=> equal bits (up to a 2^-128 collision)."""
    if t.device.type != "cpu":
        from ..digest import state_digest
        return state_digest(t)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{dtype_name(t.dtype)}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(byte_view(t))
    return "b2:" + h.hexdigest()


def digest_matches(t: torch.Tensor, digest: str) -> bool:
    """Does `t` have this wire digest? The record names the algorithm; a receiver on another device computes it
    the same way (a `fx:` digest is device-independent; a `b2:` one needs the bytes on the host)."""
    if digest.startswith("fx:"):
        from ..digest import state_digest
        return state_digest(t) == digest
    return tensor_digest(t.cpu() if t.device.type != "cpu" else t) == digest


_DIGESTS: dict = {}


def _memoized(t: torch.Tensor) -> str | None:
    """The memo's digest of `t`: the same object (a weak reference: a dead tensor's id reused by a new one misses)
    and, on the host, the same version counter (a tensor written in place since misses; on a device, where an
    extension's kernel may write without moving it, identity alone: the trainers' exports are never written)."""
    hit = _DIGESTS.get(id(t))
    if hit is None or hit[0]() is not t or (t.device.type == "cpu" and hit[2] != t._version):
        return None
    return hit[1]


def _keep(t: torch.Tensor, digest: str):
    _DIGESTS[id(t)] = (weakref.ref(t), digest, t._version)


def sender_digest(t: torch.Tensor) -> str:
    """`tensor_digest` memoized by tensor identity for the sender's manifest (`_memoized`)."""
    digest = _memoized(t)
    if digest is None:
        digest = tensor_digest(t)
        _keep(t, digest)
        if len(_DIGESTS) > 8192:
            _DIGESTS.pop(next(iter(_DIGESTS)))
    return digest


def sender_digests(tensors: list) -> list[str]:
    """`sender_digest` of each tensor, the memo's misses on one device digested in one batch (a GPU payload's
    digests cost one host copy, not one per tensor)."""
    out: list = [None] * len(tensors)
    misses: dict = {}
    for i, t in enumerate(tensors):
        out[i] = _memoized(t)
        if out[i] is not None:
            continue
        if t.device.type == "cpu":
            out[i] = sender_digest(t)
        else:
            misses.setdefault(t.device, []).append(i)
    if misses:
        from ..digest import state_digests
        for ix in misses.values():
            got = state_digests({i: tensors[i] for i in ix})
            for i in ix:
                _keep(tensors[i], got[i])
                out[i] = got[i]
        while len(_DIGESTS) > 8192:
            _DIGESTS.pop(next(iter(_DIGESTS)))
    return out


@dataclass(frozen=True)
class TensorRecord:
    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    block_shape: tuple[int, ...] | None
    version: int
    digest: str

    def to_json(self) -> dict:
        return {"name": self.name, "role": self.role, "dtype": self.dtype, "shape": list(self.shape),
                "block_shape": list(self.block_shape) if self.block_shape else None, "version": self.version,
                "digest": self.digest}

    @classmethod
    def from_json(cls, d: dict) -> "TensorRecord":
        try:
            return cls(d["name"], d["role"], d["dtype"], tuple(d["shape"]),
                       tuple(d["block_shape"]) if d.get("block_shape") else None, int(d["version"]), d["digest"])
        except (KeyError, TypeError, ValueError) as e:
            raise PayloadError(f"manifest record {d!r:.80}: {e}") from None


def record_for(name: str, role: str, t: torch.Tensor, version: int, block_shape=None, digest: str | None = None
               ) -> TensorRecord:
    return TensorRecord(name, role, dtype_name(t.dtype), tuple(t.shape), block_shape, version,
                        digest if digest is not None else sender_digest(t))


@dataclass
class Payload:
    records: list[TensorRecord]
    tensors: dict[str, torch.Tensor]
    version: int

    def items(self):
        """(record, tensor) in wire order; a record whose tensor is absent yields None."""
        for r in self.records:
            yield r, self.tensors.get(r.name)

    def names(self) -> list[str]:
        return [r.name for r in self.records]

    def with_tensor(self, name: str, t: torch.Tensor, *, restamp: bool = False) -> "Payload":
        """A copy with one tensor replaced. `restamp` recomputes the record (a sender-side fault: the manifest
        describes the wrong bytes faithfully); otherwise the record keeps the original digest (wire corruption)."""
        tensors = dict(self.tensors)
        tensors[name] = t
        recs = [replace(r, dtype=dtype_name(t.dtype), shape=tuple(t.shape), digest=tensor_digest(t))
                if (r.name == name and restamp) else r for r in self.records]
        return Payload(recs, tensors, self.version)

    def manifest(self) -> list[dict]:
        return [r.to_json() for r in self.records]


def build_payload(config: SyncConfig, trainer_hf: dict[str, torch.Tensor], version: int,
                  master_hf: dict[str, torch.Tensor] | None = None) -> Payload:
    """What the trainer sends after step `version`, in checkpoint order (each FP8 weight followed by its scale).

    FP8 on the wire (on-policy into a checkpoint engine): the trainer's own FP8 codes and scales, installed as-is.
    naive (the round trip): the FP8 forward weight dequantized to BF16; the engine quantizes on its own.
    otherwise (an engine that quantizes BF16 itself or serves it, a BF16 learner): the BF16 parameters, the
    masters cast to BF16 (`master_hf`; a BF16 learner's export is that already).
    """
    recipe = config.trainer_recipe
    entries, tensors = [], {}
    if config.split_tensors:              # a split fused GEMM's high-precision members: the trainer's values in BF16
        from ..numerics.expected import split_members_served
        trainer_hf = {**trainer_hf, **split_members_served(config, trainer_hf)}

    def add(name, role, t, block=None):
        entries.append((name, role, t, block))
        tensors[name] = t

    for spec in config.spec.tensors():
        n = spec.name
        if n in config.fp8_tensors and config.fp8_on_wire:
            add(n, ROLE_FP8, trainer_hf[n], tuple(config.recipe.block_shape))
            add(scale_name(n), ROLE_SCALE, trainer_hf[scale_name(n)], tuple(config.recipe.block_shape))
        elif n in config.fp8_tensors and config.trainer_fp8 and not config.wire_is_master:
            add(n, ROLE_HP, recipe.dequantize_weight(trainer_hf[n], trainer_hf[scale_name(n)]).to(torch.bfloat16))
        elif n in config.fp8_tensors and config.trainer_fp8:
            if master_hf is None:
                raise PayloadError(f"{n}: this sync sends the BF16 parameters (rollout.quantization="
                                   f"{config.rollout.quantization}); pass the trainer's masters")
            add(n, ROLE_HP, master_hf[n].to(torch.bfloat16))
        else:
            add(n, ROLE_HP, trainer_hf[n].to(torch.bfloat16))
    for n in config.kv_scale_names:             # the job's calibrated KV-cache scales, fp32 scalars
        if n in trainer_hf:
            add(n, ROLE_KV, trainer_hf[n].float())
    digests = sender_digests([t for _, _, t, _ in entries])
    return Payload([record_for(n, role, t, version, block, d) for (n, role, t, block), d in zip(entries, digests)],
                   tensors, version)


def payload_from_items(config: SyncConfig, items, version: int) -> Payload:
    """The wire as someone else's sync sent it: (name, tensor) in the order handed to the engine's loader (a
    user's sync function, or what `check_sync` is told the job meant to install). Each record's role is read from
    the tensor itself, not from the config -- the wire checks (S1, S5, S6) then judge it against the config: a
    one-byte float is FP8 codes, a `*_scale_inv` a block scale, a configured KV-scale name a KV scale, anything
    else high precision. A scale under a naming the recipe's wire accepts (`harness.layouts.scale_names`: vLLM's
    and SkyRL's MXFP8 `weight_scale`, uint8) is recorded under fp8check's name, as the same bytes."""
    from ..layouts.scale_names import canonical_scale
    recs, tensors = [], {}
    block = tuple(config.recipe.block_shape)
    for item in items:
        n, t = str(item[0]), item[1]
        named = canonical_scale(n, t, config.recipe.granularity)     # a stack's own naming of the recipe's scales
        if named is not None:
            n, t = named
        if n in config.kv_scale_names:
            role = ROLE_KV
        elif is_scale_name(n):
            role = ROLE_SCALE
        elif t.is_floating_point() and t.element_size() == 1:
            role = ROLE_FP8
        else:
            role = ROLE_HP
        recs.append(record_for(n, role, t, version, block if role in (ROLE_FP8, ROLE_SCALE) else None))
        tensors[n] = t
    return Payload(recs, tensors, version)


def expected_wire(config: SyncConfig) -> dict[str, tuple[str, torch.dtype]]:
    """name -> (role, dtype) of every tensor the config says one sync must carry (made once per config: the payload,
    S1 and S5 read it every sync). Callers never modify it."""
    cached = config.__dict__.get("_expected_wire")
    if cached is None:
        cached = config.__dict__["_expected_wire"] = _expected_wire(config)
    return cached


def _expected_wire(config: SyncConfig) -> dict[str, tuple[str, torch.dtype]]:
    out = {}
    for spec in config.spec.tensors():
        if spec.name in config.fp8_tensors and config.fp8_on_wire:
            out[spec.name] = (ROLE_FP8, config.recipe.fp8_dtype)
            out[scale_name(spec.name)] = (ROLE_SCALE, config.recipe.scale_dtype)
        else:
            out[spec.name] = (ROLE_HP, torch.bfloat16)
    for n in config.kv_scale_names:
        out[n] = (ROLE_KV, torch.float32)
    return out


__all__ = ["Payload", "PayloadError", "ROLES", "ROLE_FP8", "ROLE_HP", "ROLE_KV", "ROLE_SCALE", "TensorRecord",
           "build_payload", "byte_view", "dtype_name", "expected_wire", "is_scale_name", "parse_dtype",
           "payload_from_items", "record_for",
           "tensor_bytes", "tensor_digest", "weight_of_scale"]
