"""Transport: a payload as a sequence of buckets, what crosses process and device boundaries (CUDA IPC between
processes on one GPU, NCCL, the Ray object store). A bucket is a JSON header {seq, total, version, records: [...
offset, nbytes]} plus one flat uint8 buffer holding the records' bytes, 16-byte aligned, on whatever device the
payload lives (a trainer's GPU: the buffer is shared as-is, never copied through host memory). `to_bytes` /
`from_bytes` give the self-describing byte form (b"FP8B" | u32 header length | header | data) for a byte stream.

The receiver never trusts the wire: it decodes what it can, and reports lost, reordered, truncated and
digest-mismatching pieces in a ReceiveReport instead of raising, so the invariants see the damage. Transport
faults act on buckets through `truncated` and `flipped` (any device).

How a sync receives is the caller's choice, never the engine's (`receive(buckets, verify_digests, sent)`):
`hashing`, what a real receiver does (every received tensor's digest computed from its bytes), or
`beside_the_sender`, for a receiver in the sender's process (the fault matrix's reference engines), which
compares the received bytes with the sender's tensors instead: the same report (tests/test_matrix_shortcuts.py).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch

from ..bitview import bytes_equal
from ..formats.bytes import as_bytes
from .payload import Payload, PayloadError, TensorRecord, digest_matches, parse_dtype, sender_digest

MAGIC = b"FP8B"
ALIGN = 16


@dataclass
class Bucket:
    header: dict
    data: torch.Tensor              # flat uint8, on the payload's device
    # what `pack` copied in, never on the wire: (data, its version then, {name: (the sender's tensor, its version
    # then, offset, nbytes)}), read by `unpack` beside the sender (`_as_packed`)
    packed: tuple | None = field(default=None, repr=False, compare=False)

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
        parts, meta, off, sources = [], [], 0, {}
        for r in recs:
            t = payload.tensors[r.name]
            b = as_bytes(t)
            pad = (-off) % ALIGN
            if pad:
                parts.append(torch.zeros(pad, dtype=torch.uint8, device=b.device))
                off += pad
            meta.append({**r.to_json(), "offset": off, "nbytes": int(b.numel())})
            sources[r.name] = (t, t._version, off, int(b.numel()))
            parts.append(b)
            off += int(b.numel())
        device = parts[0].device if parts else torch.device("cpu")
        data = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        out.append(Bucket({"seq": seq, "total": len(groups), "version": payload.version, "records": meta}, data,
                          (data, data._version, sources)))
    return out


def _as_packed(b: Bucket, name: str, off: int, nbytes: int, ref: torch.Tensor) -> bool:
    """These received bytes are the ones `pack` copied from `ref` into this bucket, and neither was written since:
    the same tensor objects with unchanged version counters (harness.memo.IdentityMemo's rule; host tensors only,
    where PyTorch's own ops are what write them). A bucket a fault rebuilt, cut or flipped carries no record."""
    if b.packed is None or ref.device.type != "cpu":
        return False
    data, version, sources = b.packed
    src = sources.get(name)
    return (src is not None and data is b.data and data._version == version and src[0] is ref
            and ref._version == src[1] and src[2:] == (off, nbytes))


def _digests_ok(received: list, sent) -> list[bool]:
    """Do the received bytes have the manifest's digests? Where the sender's tensor of that name is at hand (the
    pipeline's in-process wire) and its bytes equal the received ones, the answer is whether the sender's digest --
    memoized by tensor identity, computed once per distinct tensor -- is the manifest's: the same boolean as
    hashing the received bytes again, for a byte compare (several times faster than a blake2b pass; compared in
    64-bit words where the bytes allow, harness.bitview), or for none where they are the sender's bytes by
    construction (`_as_packed`). The others are digested: a device's in one batch."""
    out: list = [None] * len(received)
    rest: list = []
    for i, (rec, t, raw, packed) in enumerate(received):
        ref = sent.get(rec.name) if sent is not None else None
        if ref is not None and ref.dtype == t.dtype and tuple(ref.shape) == tuple(t.shape) and ref.device == t.device:
            known = sender_digest(ref)
            if known[:3] == rec.digest[:3] and (packed or bytes_equal(ref, raw)):
                out[i] = known == rec.digest
                continue
        rest.append(i)
    on_device = [i for i in rest if received[i][2].device.type != "cpu" and received[i][0].digest.startswith("fx:")]
    if on_device:
        from ..digest import state_digests
        got = state_digests({i: received[i][1] for i in on_device})
        for i in on_device:
            out[i] = got[i] == received[i][0].digest
    for i in rest:
        if out[i] is None:
            out[i] = digest_matches(received[i][1], received[i][0].digest)
    return out


def unpack(buckets: list, verify_digests: bool = True, sent: dict | None = None) -> tuple[Payload, ReceiveReport]:
    """Buckets (or their byte form) -> the payload as received; tensors are views into the buckets' buffers.
    `sent`: the sender's tensors by name, where the receiver runs beside the sender (a shortcut for the digest
    check that gives the same answer, `_digest_ok`)."""
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
            ref = sent.get(rec.name) if sent is not None else None
            order.append(len(received))
            received.append((rec, t, raw, ref is not None and _as_packed(b, rec.name, off, nbytes, ref)))
    # every received tensor's digest at once (on a GPU one batch, one host copy), then the verdicts in wire order
    ok = _digests_ok(received, sent)
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


def beside_the_sender(buckets: list, verify_digests: bool, sent: Payload) -> tuple[Payload, ReceiveReport]:
    """The receiver beside the sender, in its process: the digest check compares the received bytes with the
    sender's tensors (bytes the packing copied that nobody wrote since are not compared at all). The same report
    as `hashing`; only for a receiver that can read the sender's tensors."""
    return unpack(buckets, verify_digests, sent=sent.tensors)
