"""The fault matrix's receive: its reference engines receive in the sender's process, so the digest check may read
the sender's tensors. `beside_the_sender` is a receive strategy (`run_sync(receive=...)`) giving the report of
`transport.hashing` (tests/test_matrix_shortcuts.py); only for a receiver that can read the sender's tensors."""
from __future__ import annotations

from functools import partial

from fp8check.harness.bitview import bytes_equal
from fp8check.harness.sync.payload import Payload, sender_digest
from fp8check.harness.sync.transport import ReceiveReport, digests_hashed, unpack


def digests_beside(sent: dict, received: list) -> list[bool]:
    """`transport.digests_hashed`'s answer for every received (record, tensor, raw bytes), given the sender's
    tensors by name: where the sender's tensor has the received bytes, whether the sender's digest (memoized by
    tensor identity) is the manifest's; the others are hashed."""
    out: list = [None] * len(received)
    rest: list = []
    for i, (rec, t, raw) in enumerate(received):
        ref = sent.get(rec.name)
        if ref is not None and ref.dtype == t.dtype and tuple(ref.shape) == tuple(t.shape) and ref.device == t.device:
            known = sender_digest(ref)
            # the digest's kind and size first: a byte compare only where the manifest could be the sender's
            if known[:3] == rec.digest[:3] and bytes_equal(ref, raw):
                out[i] = known == rec.digest
                continue
        rest.append(i)
    for i, ok in zip(rest, digests_hashed([received[i] for i in rest])):
        out[i] = ok
    return out


def beside_the_sender(buckets: list, verify_digests: bool, sent: Payload) -> tuple[Payload, ReceiveReport]:
    """The receiver beside the sender: `transport.unpack` with the digest check `digests_beside` over `sent`."""
    return unpack(buckets, verify_digests, digests_ok=partial(digests_beside, sent.tensors))
