"""Serialized transport: a payload as a sequence of byte buckets (what crosses process / node boundaries:
NCCL broadcast, CUDA IPC, Ray object store). Each bucket is self-describing:

    b"FP8B" | u32 header length | header JSON {seq, total, version, records: [... offset, nbytes]} | data

The receiver never trusts the wire: it decodes what it can, and reports lost, reordered, truncated and
digest-mismatching pieces in a ReceiveReport instead of raising, so the invariants see the damage.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch

from .payload import Payload, PayloadError, TensorRecord, digest_matches, parse_dtype, tensor_bytes

MAGIC = b"FP8B"


@dataclass
class ReceiveReport:
    buckets: int = 0
    expected_buckets: int | None = None
    sequence: list[int] = field(default_factory=list)
    decode_errors: list[str] = field(default_factory=list)
    digest_mismatch: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)       # tensors not handed to the engine

    @property
    def in_order(self) -> bool:
        return self.sequence == sorted(self.sequence)

    @property
    def complete(self) -> bool:
        return (self.expected_buckets is not None and sorted(self.sequence) == list(range(self.expected_buckets))
                and not self.decode_errors)

    def to_json(self) -> dict:
        return {"buckets": self.buckets, "expected_buckets": self.expected_buckets, "sequence": self.sequence,
                "decode_errors": self.decode_errors, "digest_mismatch": self.digest_mismatch, "dropped": self.dropped}


def pack(payload: Payload, bucket_bytes: int) -> list[bytes]:
    groups: list[list[TensorRecord]] = [[]]
    size = 0
    for r in payload.records:
        n = payload.tensors[r.name].numel() * payload.tensors[r.name].element_size()
        if groups[-1] and size + n > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += n
    out = []
    for seq, recs in enumerate(groups):
        data, meta, off = [], [], 0
        for r in recs:
            b = tensor_bytes(payload.tensors[r.name])
            meta.append({**r.to_json(), "offset": off, "nbytes": len(b)})
            data.append(b)
            off += len(b)
        header = json.dumps({"seq": seq, "total": len(groups), "version": payload.version, "records": meta}).encode()
        out.append(MAGIC + struct.pack("<I", len(header)) + header + b"".join(data))
    return out


def unpack(buckets: list[bytes], verify_digests: bool = True) -> tuple[Payload, ReceiveReport]:
    rep = ReceiveReport()
    records: list[TensorRecord] = []
    tensors: dict[str, torch.Tensor] = {}
    version = -1
    for i, b in enumerate(buckets):
        rep.buckets += 1
        if len(b) < 8 or b[:4] != MAGIC:
            rep.decode_errors.append(f"bucket {i}: bad magic or too short ({len(b)} bytes)")
            continue
        (hlen,) = struct.unpack("<I", b[4:8])
        try:
            header = json.loads(b[8:8 + hlen])
        except (ValueError, UnicodeDecodeError) as e:
            rep.decode_errors.append(f"bucket {i}: header unreadable ({e.__class__.__name__})")
            continue
        rep.sequence.append(int(header["seq"]))
        rep.expected_buckets = int(header["total"])
        version = int(header["version"])
        data = b[8 + hlen:]
        for m in header["records"]:
            try:
                rec = TensorRecord.from_json(m)
            except PayloadError as e:
                rep.decode_errors.append(f"bucket {i}: {e}")
                continue
            records.append(rec)
            raw = data[m["offset"]:m["offset"] + m["nbytes"]]
            if len(raw) != m["nbytes"]:
                rep.decode_errors.append(f"bucket {i}: {rec.name} truncated ({len(raw)} of {m['nbytes']} bytes)")
                rep.dropped.append(rec.name)
                continue
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(parse_dtype(rec.dtype)).reshape(rec.shape) \
                if raw else torch.empty(rec.shape, dtype=parse_dtype(rec.dtype))
            if not digest_matches(t, rec.digest):
                rep.digest_mismatch.append(rec.name)
                if verify_digests:
                    rep.dropped.append(rec.name)
                    continue
            tensors[rec.name] = t
    return Payload(records, tensors, version), rep
