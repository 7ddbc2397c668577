"""Transport faults: truncated, reordered or corrupted buckets."""
from __future__ import annotations

from dataclasses import replace

from fp8check.harness.sync.transport import flipped, truncated

from .base import Fault, NoTarget, register

SMALL_BUCKETS = lambda c: replace(c, transport=replace(c.transport, bucket_bytes=1 << 20))  # noqa: E731


def _truncate(c, buckets, which=-1, cut=1000):
    b = list(buckets)
    b[which] = truncated(b[which], cut)
    return b


register(Fault("bucket_truncated", "transport", "buckets", ("S1", "S4"), "the last bucket loses its final 1000 bytes",
               _truncate, configure=SMALL_BUCKETS))


def _reorder(c, buckets):
    if len(buckets) < 2:
        raise NoTarget("one bucket only")
    b = list(buckets)
    b[0], b[1] = b[1], b[0]
    return b


register(Fault("buckets_reordered", "transport", "buckets", ("S7",), "the first two buckets applied out of order",
             _reorder, configure=SMALL_BUCKETS))


def _corrupt(c, buckets, which=0, offset=-100):
    b = list(buckets)
    b[which] = flipped(b[which], offset, 0x40)
    return b


# the receiver's digest check drops the damaged bucket: its tensors keep the poison (S1) and their values differ (S4)
register(Fault("bytes_corrupted", "transport", "buckets", ("S1", "S4"), "one byte inside a bucket's data flipped",
               _corrupt, configure=SMALL_BUCKETS, silent=True, may=("S2", "S3")))
# the flipped byte lands in a high-precision tensor on the tiny models (S4 alone); in codes or a scale, S2 / S3 too
register(Fault("bytes_corrupted_unverified", "transport", "buckets", ("S4",),
               "one byte flipped in transit with receiver digest checks off", _corrupt,
               configure=lambda c: replace(SMALL_BUCKETS(c), transport=replace(SMALL_BUCKETS(c).transport,
                                                                                verify_digests=False)), silent=True,
               may=("S2", "S3")))
