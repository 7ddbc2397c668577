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

from .payload import Payload, PayloadError, TensorRecord, byte_view, digest_matches, parse_dtype

MAGIC = b"FP8B"
ALIGN = 16          # the data section starts at a multiple of this, so tensors can be views of the bucket


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


def pack(payload: Payload, bucket_bytes: int) -> list[bytearray]:
    """The payload as buckets, each written once into its own buffer (no intermediate copies of the tensors)."""
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
        views, meta, off = [], [], 0
        for r in recs:
            v = byte_view(payload.tensors[r.name])
            meta.append({**r.to_json(), "offset": off, "nbytes": int(v.size)})
            views.append(v)
            off += int(v.size)
        header = json.dumps({"seq": seq, "total": len(groups), "version": payload.version, "records": meta}).encode()
        header += b" " * (-(8 + len(header)) % ALIGN)       # JSON whitespace: the data starts aligned
        start = 8 + len(header)
        buf = bytearray(start + off)
        buf[:8] = MAGIC + struct.pack("<I", len(header))
        buf[8:start] = header
        mv = memoryview(buf)
        for m, v in zip(meta, views):
            if m["nbytes"]:
                mv[start + m["offset"]:start + m["offset"] + m["nbytes"]] = v
        out.append(buf)
    return out


def unpack(buckets: list[bytes], verify_digests: bool = True) -> tuple[Payload, ReceiveReport]:
    """Decode buckets; received tensors are views of their bucket's buffer (a read-only bucket is copied once)."""
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
            header = json.loads(bytes(b[8:8 + hlen]))
        except (ValueError, UnicodeDecodeError) as e:
            rep.decode_errors.append(f"bucket {i}: header unreadable ({e.__class__.__name__})")
            continue
        rep.sequence.append(int(header["seq"]))
        rep.expected_buckets = int(header["total"])
        version = int(header["version"])
        if not isinstance(b, bytearray):
            b = bytearray(b)                  # tensors need a writable buffer to view
        start = 8 + hlen
        size = len(b) - start
        for m in header["records"]:
            try:
                rec = TensorRecord.from_json(m)
            except PayloadError as e:
                rep.decode_errors.append(f"bucket {i}: {e}")
                continue
            records.append(rec)
            off, n = m.get("offset"), m.get("nbytes")
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (off, n)):
                rep.decode_errors.append(f"bucket {i}: {rec.name} has no valid offset / nbytes in the header")
                rep.dropped.append(rec.name)
                continue
            got = max(0, min(n, size - off))
            if got != n:
                rep.decode_errors.append(f"bucket {i}: {rec.name} truncated ({got} of {n} bytes)")
                rep.dropped.append(rec.name)
                continue
            dt = parse_dtype(rec.dtype)
            if not n:
                t = torch.empty(rec.shape, dtype=dt)
            elif (start + off) % torch.empty((), dtype=dt).element_size():      # unaligned: a copy of its own
                own = bytearray(b[start + off:start + off + n])
                t = torch.frombuffer(own, dtype=torch.uint8).view(dt).reshape(rec.shape)
            else:
                t = torch.frombuffer(b, dtype=torch.uint8, count=n, offset=start + off).view(dt).reshape(rec.shape)
            if not digest_matches(t, rec.digest):
                rep.digest_mismatch.append(rec.name)
                if verify_digests:
                    rep.dropped.append(rec.name)
                    continue
            tensors[rec.name] = t
    return Payload(records, tensors, version), rep
