"""Bit comparisons over the widest integer view a tensor's bytes allow: a wide word compares several bytes per
element, and at real shapes (a vocabulary embedding is over a gigabyte) the checks compare gigabytes per sync.
Element-wise differences are found chunk by chunk, so evidence for one differing element never allocates an index
per element of the tensor."""
from __future__ import annotations

from enum import Enum

import torch

from .formats.bytes import as_bytes

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CHUNK = 1 << 24           # elements compared at a time when locating differences


class ScreenMode(Enum):
    """Where a screen's flags (`differs`, `flag`, and the screens built on them) are made host bools. Either mode
    gives the same bools after `resolve`; they differ only in when the host reads them.

    BY_DEVICE (what every production caller uses): a bool at once on the CPU, where a host read costs nothing; a
    deferred flag (0-d tensor or `FlagOf`) on any other device, for `resolve`'s one copy.
    DEFERRED: the deferred flag on every device, CPU included: the code a GPU runs, exercised on CPU tensors."""
    BY_DEVICE = "by-device"
    DEFERRED = "deferred"

    def defers(self, device) -> bool:
        """Whether a flag computed on `device` stays a tensor until `resolve`."""
        return self is ScreenMode.DEFERRED or device.type != "cpu"


def words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat view of the widest integer type dividing the byte count (no copy when it is
    contiguous)."""
    b = as_bytes(t)
    n = b.numel()
    for size in (8, 4, 2):
        if n % size == 0 and b.storage_offset() % size == 0:
            try:
                return b.view(_INT[size])
            except RuntimeError:            # storage not aligned for the wider type
                continue
    return b


def _word_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tensors' bytes as words of one width (the widest both allow)."""
    wa, wb = words(a), words(b)
    return (wa, wb) if wa.dtype == wb.dtype else (as_bytes(a), as_bytes(b))


def _one_view(wa: torch.Tensor, wb: torch.Tensor) -> bool:
    """One storage, one view of it (a captured tensor that is the expected one): equal without a read."""
    return (wa.device == wb.device and wa.device.type != "meta" and wa.numel() > 0 and wa.numel() == wb.numel()
            and wa.data_ptr() == wb.data_ptr() and wa.stride() == wb.stride())


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bytes (whatever the dtypes say)."""
    if a is b:                          # one tensor (a proven parameter read as the trainer's own): no read
        return True
    wa, wb = _word_pair(a, b)
    if wa.numel() != wb.numel():
        return False
    return _one_view(wa, wb) or torch.equal(wa, wb)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype, same bytes."""
    return a.shape == b.shape and a.dtype == b.dtype and bytes_equal(a, b)


def differs(a: torch.Tensor, b: torch.Tensor, mode: ScreenMode = ScreenMode.BY_DEVICE):
    """`not bits_equal(a, b)` as a flag that need not cross to the host yet: a Python bool, or, for two tensors on
    one device that `mode` defers on, a 0-d bool tensor there (compared chunk by chunk: a bounded temporary).
    `resolve` turns a list of flags into bools with one copy per device, so a check comparing many tensors waits
    on the device once, not once per `torch.equal`. Tensors on two devices, or on meta, give a bool."""
    if a is b:
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if a.device != b.device or a.device.type == "meta" or not mode.defers(a.device):
        return not bytes_equal(a, b)
    wa, wb = _word_pair(a, b)
    if not wa.numel() or _one_view(wa, wb):
        return False
    flags = [(wa[o:o + CHUNK] != wb[o:o + CHUNK]).any() for o in range(0, wa.numel(), CHUNK)]
    return flags[0] if len(flags) == 1 else torch.stack(flags).any()


class FlagOf:
    """Element `index` of a bool vector on a device, as a flag: what a screen over many tensors at once gives each
    tensor (S3's encodings, TE's zero-block rule). One Python object, not a 0-d tensor each (a tensor view is host
    work per flag, and an MoE model has thousands of expert weights); `resolve` copies each vector to the host
    once."""
    __slots__ = ("vector", "index")

    def __init__(self, vector: torch.Tensor, index: int):
        self.vector, self.index = vector, index

    @property
    def device(self):
        return self.vector.device

    def reshape(self, *shape):
        """The flag as a 0-d tensor (`any_of` stacks those)."""
        return self.vector[self.index].reshape(*shape)


def flag(mask_any, mode: ScreenMode = ScreenMode.BY_DEVICE):
    """A condition computed on a tensor's device (a 0-d bool tensor, or a `FlagOf`) as a flag: a bool at once where
    `mode` does not defer on that device, left there for `resolve` otherwise."""
    if not mode.defers(mask_any.device):
        return bool(mask_any.reshape(()))
    return mask_any


def any_of(*flags):
    """The flags' disjunction, still a flag (a bool where every one is)."""
    if any(f is True for f in flags):
        return True
    pending = [f for f in flags if not isinstance(f, bool)]
    if not pending:
        return False
    return pending[0] if len(pending) == 1 else torch.stack([f.reshape(()) for f in pending]).any()


def resolve(flags) -> list[bool]:
    """Flags (bools, 0-d tensors from `differs` / `flag`, `FlagOf`s) -> bools: one host copy per device for the
    0-d tensors, one per vector for the `FlagOf`s."""
    out = [f if isinstance(f, bool) else None for f in flags]
    pending: dict = {}
    vectors: dict = {}
    for i, f in enumerate(flags):
        if out[i] is not None:
            continue
        if isinstance(f, FlagOf):
            vectors.setdefault(id(f.vector), (f.vector, []))[1].append(i)
        else:
            pending.setdefault(f.device, []).append(i)
    for ix in pending.values():
        for i, v in zip(ix, torch.stack([flags[i].reshape(()) for i in ix]).cpu().tolist()):
            out[i] = bool(v)
    for vector, ix in vectors.values():
        host = vector.tolist()
        for i in ix:
            out[i] = bool(host[flags[i].index])
    return out


def elements(t: torch.Tensor) -> torch.Tensor:
    """One integer per element (its bytes), flat: element-wise bit comparisons without a byte axis."""
    return as_bytes(t).view(_INT[t.element_size()]) if t.element_size() in _INT else \
        as_bytes(t).reshape(t.numel(), t.element_size())


def _any(mask: torch.Tensor) -> bool:
    """`mask.any()` of a bool mask: its bytes' max where it is contiguous (the CPU's bool `any` is far slower than a
    uint8 max)."""
    if mask.dtype == torch.bool and mask.numel() and mask.is_contiguous():
        return bool(mask.view(torch.uint8).amax())
    return bool(mask.any())


def _first_true(mask: torch.Tensor, row: int = 4096) -> int:
    """Flat index of the first True of a bool mask holding one: the first row of `row` elements that holds one,
    then its first (argmax returns the first maximum; a row max first spares the CPU's slow uint8 argmax over the
    whole mask)."""
    u = mask.view(torch.uint8)
    if not mask.is_contiguous():
        return int(u.argmax())
    u = u.reshape(-1)
    whole = u.numel() // row * row
    if whole:
        rows = u[:whole].view(-1, row).amax(1)
        if bool(rows.amax()):
            i = int(rows.argmax())
            return i * row + int(u[i * row:(i + 1) * row].argmax())
    return whole + int(u[whole:].argmax())


def first_difference(ne_chunks) -> tuple[int | None, int]:
    """(flat index of the first True, number of Trues) over an iterable of (offset, bool mask) chunks."""
    first, count = None, 0
    for off, m in ne_chunks:
        if not _any(m):                       # the common case: nothing differs, no count to take
            continue
        c = int(m.sum())
        if c and first is None:
            first = off + _first_true(m)
        count += c
    return first, count


def bit_chunks(a: torch.Tensor, b: torch.Tensor):
    """(offset, elementwise bits-differ mask) chunks of two same-shape tensors of one element size."""
    ea, eb = elements(a), elements(b)
    for off in range(0, a.numel(), CHUNK):
        x, y = ea[off:off + CHUNK], eb[off:off + CHUNK]
        yield off, (x != y) if x.dim() == 1 else (x != y).any(-1)


def value_chunks(a: torch.Tensor, b: torch.Tensor):
    """(offset, values-differ mask) chunks, NaN == NaN and -0 == 0, compared as fp32."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    for off in range(0, a.numel(), CHUNK):
        x, y = fa[off:off + CHUNK].float(), fb[off:off + CHUNK].float()
        if bytes_equal(x, y):         # identical fp32 bits: identical values (one word compare, not four fp32 passes)
            yield off, torch.zeros(x.shape, dtype=torch.bool, device=x.device)
            continue
        yield off, ~((x == y) | (torch.isnan(x) & torch.isnan(y)))
