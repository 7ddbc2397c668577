"""The fault matrix's wire: its reference engines receive in the sender's process, so the digest check may read the
sender's tensors. `pack_beside` and `beside_the_sender` are the pack and receive strategies the matrix passes to
`run_sync` (`pack=`, `receive=`); the receive report is `transport.hashing`'s (tests/test_matrix_shortcuts.py).
Only for a receiver that can read the sender's tensors."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from fp8check.harness.bitview import bytes_equal
from fp8check.harness.sync.payload import Payload, sender_digest
from fp8check.harness.sync.transport import Bucket, ReceiveReport, digests_hashed, pack, unpack


@dataclass
class PackedBucket(Bucket):
    # what `pack_beside` copied in, never on the wire: (data, its version then, {name: (the sender's tensor, its
    # version then, offset, nbytes)}); a bucket a fault rebuilt, cut or flipped is a plain Bucket
    packed: tuple | None = field(default=None, repr=False, compare=False)


def pack_beside(payload: Payload, bucket_bytes: int) -> list[Bucket]:
    """`transport.pack`, each bucket remembering which sender tensor it copied where (`PackedBucket`)."""
    out = []
    for b in pack(payload, bucket_bytes):
        sources = {}
        for m in b.header["records"]:
            t = payload.tensors[m["name"]]
            sources[m["name"]] = (t, t._version, int(m["offset"]), int(m["nbytes"]))
        out.append(PackedBucket(b.header, b.data, (b.data, b.data._version, sources)))
    return out


def as_packed(buckets: list, sent: dict) -> set:
    """(name, address, nbytes) of the bytes in `buckets` that `pack_beside` copied from the sender's tensor of that
    name, neither written since: the same tensor objects with unchanged version counters (harness.memo.IdentityMemo's
    rule; host tensors only, where PyTorch's own ops are what write them)."""
    known = set()
    for b in buckets:
        if not isinstance(b, PackedBucket) or b.packed is None:
            continue
        data, version, sources = b.packed
        if data is not b.data or data._version != version or data.device.type != "cpu":
            continue
        for name, (t, v, off, nbytes) in sources.items():
            if sent.get(name) is t and t._version == v:
                known.add((name, data.data_ptr() + off, nbytes))
    return known


def digests_beside(sent: dict, received: list, packed=frozenset()) -> list[bool]:
    """`transport.digests_hashed`'s answer for every received (record, tensor, raw bytes), given the sender's
    tensors by name: where the sender's tensor has the received bytes -- compared, or known from the packing
    (`packed`: `as_packed`'s) -- whether the sender's digest (memoized by tensor identity) is the manifest's; the
    others are hashed."""
    out: list = [None] * len(received)
    rest: list = []
    for i, (rec, t, raw) in enumerate(received):
        ref = sent.get(rec.name)
        if ref is not None and ref.dtype == t.dtype and tuple(ref.shape) == tuple(t.shape) and ref.device == t.device:
            known = sender_digest(ref)
            # the digest's kind and size first: the bytes only where the manifest could be the sender's
            if known[:3] == rec.digest[:3] and ((rec.name, raw.data_ptr(), raw.numel()) in packed
                                               or bytes_equal(ref, raw)):
                out[i] = known == rec.digest
                continue
        rest.append(i)
    for i, ok in zip(rest, digests_hashed([received[i] for i in rest])):
        out[i] = ok
    return out


def beside_the_sender(buckets: list, verify_digests: bool, sent: Payload) -> tuple[Payload, ReceiveReport]:
    """The receiver beside the sender: `transport.unpack` with the digest check `digests_beside` over `sent` (the
    bytes `pack_beside` copied that nobody wrote since are not even compared)."""
    check = partial(digests_beside, sent.tensors, packed=as_packed(buckets, sent.tensors))
    return unpack(buckets, verify_digests, digests_ok=check)
