"""Transport: a payload as a sequence of buckets, what crosses process and device boundaries (CUDA IPC between
processes on one GPU, NCCL, the Ray object store). A bucket is a JSON header {seq, total, version, records: [...
offset, nbytes]} plus one flat uint8 buffer holding the records' bytes, 16-byte aligned, on whatever device the
payload lives (a trainer's GPU: the buffer is shared as-is, never copied through host memory). `to_bytes` /
`from_bytes` give the self-describing byte form (b"FP8B" | u32 header length | header | data) for a byte stream.

The receiver never trusts the wire: it decodes what it can, and reports lost, reordered, truncated and
digest-mismatching pieces in a ReceiveReport instead of raising, so the invariants see the damage. Transport
faults act on buckets through `truncated` and `flipped` (any device).

How a sync packs and receives is the caller's choice, never the engine's (`pack(payload, bucket_bytes)`,
`receive(buckets, verify_digests, sent)`); `pack` and `hashing` are what a real sender and receiver do: every
received tensor's digest computed from its bytes. `unpack` takes the digest check as `digests_ok`, so a caller's
receive strategy may decide it otherwise.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch

from ..formats.bytes import as_bytes
from .payload import Payload, PayloadError, TensorRecord, digest_matches, parse_dtype

MAGIC = b"FP8B"
ALIGN = 16


@dataclass
class Bucket:
    header: dict
    data: torch.Tensor              # flat uint8, on the payload's device

    def __len__(self) -> int:
        return int(self.data.numel())

    def to_bytes(self) -> bytes:
        h = json.dumps(self.header).encode()
        return MAGIC + struct.pack("<I", len(h)) + h + self.data.cpu().numpy().tobytes()

    @classmethod
    def from_bytes(cls, b: bytes) -> "Bucket":
        """Raises PayloadError when the bytes are not a bucket."""
        if len(b) < 8 or b[:4] != MAGIC:
            raise PayloadError(f"bad magic or too short ({len(b)} bytes)")
        (hlen,) = struct.unpack("<I", b[4:8])
        try:
            header = json.loads(b[8:8 + hlen])
        except (ValueError, UnicodeDecodeError) as e:
            raise PayloadError(f"header unreadable ({e.__class__.__name__})") from None
        raw = b[8 + hlen:]
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return cls(header, data)


def truncated(b: Bucket, cut: int) -> Bucket:
    """The bucket without its last `cut` bytes (a transfer cut short)."""
    return Bucket(b.header, b.data[: max(0, len(b) - cut)])


def flipped(b: Bucket, offset: int, mask: int) -> Bucket:
    """The bucket with one byte XOR-ed (corruption in transit); the original is left as it was."""
    d = b.data.clone()
    d[offset] ^= mask
    return Bucket(b.header, d)


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


def pack(payload: Payload, bucket_bytes: int) -> list[Bucket]:
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
        parts, meta, off = [], [], 0
        for r in recs:
            t = payload.tensors[r.name]
            b = as_bytes(t)
            pad = (-off) % ALIGN
            if pad:
                parts.append(torch.zeros(pad, dtype=torch.uint8, device=b.device))
                off += pad
            meta.append({**r.to_json(), "offset": off, "nbytes": int(b.numel())})
            parts.append(b)
            off += int(b.numel())
        device = parts[0].device if parts else torch.device("cpu")
        data = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        out.append(Bucket({"seq": seq, "total": len(groups), "version": payload.version, "records": meta}, data))
    return out


def digests_hashed(received: list) -> list[bool]:
    """Does each received (record, tensor, raw bytes) have its manifest's digest, computed from its bytes: a
    device's digests in one batch (one host copy), the others one at a time. The default digest check of `unpack`."""
    out: list = [None] * len(received)
    on_device = [i for i, (rec, _, raw) in enumerate(received)
                 if raw.device.type != "cpu" and rec.digest.startswith("fx:")]
    if on_device:
        from ..digest import state_digests
        got = state_digests({i: received[i][1] for i in on_device})
        for i in on_device:
            out[i] = got[i] == received[i][0].digest
    for i, (rec, t, _) in enumerate(received):
        if out[i] is None:
            out[i] = digest_matches(t, rec.digest)
    return out


def unpack(buckets: list, verify_digests: bool = True, digests_ok=None) -> tuple[Payload, ReceiveReport]:
    """Buckets (or their byte form) -> the payload as received; tensors are views into the buckets' buffers.
    `digests_ok(received) -> list[bool]`: for every decoded (record, tensor, raw bytes), in wire order, whether it
    has its manifest's digest (`digests_hashed` by default); called once, with every decoded tensor."""
    rep = ReceiveReport()
    records: list[TensorRecord] = []
    tensors: dict[str, torch.Tensor] = {}
    received: list = []                       # (record, tensor, raw bytes) decoded, in wire order
    order: list = []                          # wire order: a name dropped while decoding, or an index of received
    version = -1
    for i, b in enumerate(buckets):
        rep.buckets += 1
        if not isinstance(b, Bucket):
            try:
                b = Bucket.from_bytes(b)
            except PayloadError as e:
                rep.decode_errors.append(f"bucket {i}: {e}")
                continue
        try:
            h = b.header
            seq, total, version, metas = int(h["seq"]), int(h["total"]), int(h["version"]), list(h["records"])
        except (KeyError, TypeError, ValueError) as e:
            rep.decode_errors.append(f"bucket {i}: header incomplete ({e.__class__.__name__}: {e})")
            continue
        rep.sequence.append(seq)
        rep.expected_buckets = total
        for m in metas:
            try:
                rec = TensorRecord.from_json(m)
                off, nbytes = int(m["offset"]), int(m["nbytes"])
            except (PayloadError, KeyError, TypeError, ValueError) as e:
                rep.decode_errors.append(f"bucket {i}: {e}")
                continue
            records.append(rec)
            raw = b.data[off:off + nbytes]
            if raw.numel() != nbytes:
                rep.decode_errors.append(f"bucket {i}: {rec.name} truncated ({raw.numel()} of {nbytes} bytes)")
                order.append(rec.name)
                continue
            try:
                if nbytes and raw.storage_offset() % parse_dtype(rec.dtype).itemsize:
                    raw = raw.clone()               # unaligned for its dtype: a copy of its own
                t = raw.view(parse_dtype(rec.dtype)).reshape(rec.shape) if nbytes else \
                    torch.empty(rec.shape, dtype=parse_dtype(rec.dtype), device=b.data.device)
            except (RuntimeError, PayloadError) as e:
                rep.decode_errors.append(f"bucket {i}: {rec.name} does not decode as {rec.dtype} {list(rec.shape)} "
                                         f"({e.__class__.__name__})")
                order.append(rec.name)
                continue
            order.append(len(received))
            received.append((rec, t, raw))
    # every received tensor's digest at once (on a GPU one batch, one host copy), then the verdicts in wire order
    ok = (digests_ok or digests_hashed)(received)
    for k in order:
        if isinstance(k, str):
            rep.dropped.append(k)
            continue
        rec, t = received[k][:2]
        if not ok[k]:
            rep.digest_mismatch.append(rec.name)
            if verify_digests:
                rep.dropped.append(rec.name)
                continue
        tensors[rec.name] = t
    return Payload(records, tensors, version), rep


def hashing(buckets: list, verify_digests: bool, sent: Payload) -> tuple[Payload, ReceiveReport]:
    """The receiver as a real engine's: every received tensor's digest computed from its bytes (`sent` unread)."""
    return unpack(buckets, verify_digests)
