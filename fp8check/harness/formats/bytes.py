"""Raw bytes of a tensor as a flat uint8 view (a fresh stride-1 copy when the layout needs one: PyTorch calls
a tensor with size-1 dims "contiguous" whatever their strides, and refuses to view those as bytes), and the
poison byte engines are filled with before a sync (S1 proves none survives)."""
import torch

SENTINEL = 0xFF           # poison / uninitialised byte: NaN in e4m3fn, bf16 and fp32 alike
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = (t.detach() if t.requires_grad else t).reshape(-1)      # the checks call this ~500k times a matrix
    if flat.numel() and flat.stride(0) != 1:
        flat = torch.empty(flat.numel(), dtype=t.dtype, device=t.device).copy_(flat)
    return flat.view(torch.uint8)


def roll_rows(t: torch.Tensor, shift: int) -> torch.Tensor:
    """`t` with its rows rotated by `shift`, moved as raw bytes (CUDA has no roll kernel for FP8 dtypes)."""
    if t.element_size() == 1 and t.dtype != torch.uint8:
        return torch.roll(t.contiguous().view(torch.uint8), shift, 0).view(t.dtype)
    return torch.roll(t, shift, 0).contiguous()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill every byte of `t` with the sentinel, in place -- also through a strided view (vLLM's online per-tensor
    layers are read as the transpose of their stored codes: `reshape` would fill a copy)."""
    if not t.numel():
        return t
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(SENTINEL)
    elif t.is_contiguous() and t.reshape(-1).stride(0) == 1:   # size-1 dims may carry any stride ("contiguous")
        t.reshape(-1).view(torch.uint8).fill_(SENTINEL)
    else:
        full = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        full.reshape(-1).view(torch.uint8).fill_(SENTINEL)
        t.copy_(full)
    return t


def is_sentinel(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: every byte of the element is the poison byte (all bits set)."""
    b = as_bytes(t)
    if t.element_size() == 1:           # against a tensor: the CPU kernel for a scalar operand is ~15x slower
        return (b == torch.full_like(b, SENTINEL)).reshape(t.shape)
    return (b.view(_INT_OF_SIZE[t.element_size()]) == -1).reshape(t.shape)


def _sentinel_flag(t: torch.Tensor) -> torch.Tensor:
    """0-d bool on t's device, no host sync: some element of t is all poison bytes. One-byte elements: the
    largest byte is the poison byte (one reduction). Wider ones, two fast passes: a byte compare, then the largest
    element of that 0/1 byte mask read as one integer per element (all bytes poison <=> 0x01..01, the largest value
    such an integer can take)."""
    b = as_bytes(t)
    size = t.element_size()
    if size == 1:
        return b.amax() == SENTINEL
    # on the CPU against a tensor: its kernel for a scalar operand is ~15x slower
    hit = (b == (torch.full_like(b, SENTINEL) if b.device.type == "cpu" else SENTINEL)).view(torch.uint8)
    if size in _INT_OF_SIZE:
        return hit.view(_INT_OF_SIZE[size]).amax() == int.from_bytes(b"\x01" * size, "little")
    return is_sentinel(t).any()


def any_sentinel(t: torch.Tensor) -> bool:
    """`is_sentinel(t).any()`, through `_sentinel_flag`'s fast passes."""
    return bool(t.numel()) and bool(_sentinel_flag(t))


SCAN_CHUNK = 1 << 24       # elements screened at a time (a bounded temporary whatever the tensor's size)


def sentinel_flags(tensors) -> list[bool]:
    """[any_sentinel(t) for t in tensors], screened chunk by chunk; on a GPU the flags of the whole list cross to
    the host in one copy instead of one sync per tensor (S1 screens every engine parameter after a poisoned
    sync). `tensors` may be a generator: each tensor is dropped once screened (a lazy snapshot read from disk is
    never held whole)."""
    out: list = []
    pending: dict = {}                   # device -> [(tensor index, 0-d flag)]
    for i, t in enumerate(tensors):
        out.append(False)
        if not t.numel():
            continue
        flat = t.detach().reshape(-1)
        for a in range(0, flat.numel(), SCAN_CHUNK):
            chunk = flat[a:a + SCAN_CHUNK]
            if t.device.type == "cpu":
                if any_sentinel(chunk):
                    out[i] = True
                    break
            else:
                pending.setdefault(t.device, []).append((i, _sentinel_flag(chunk)))
    for flags in pending.values():
        for (i, _), hit in zip(flags, torch.stack([f for _, f in flags]).cpu().tolist()):
            out[i] = out[i] or bool(hit)
    return out
