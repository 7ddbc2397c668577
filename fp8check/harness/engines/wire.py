"""The engine wire: tensors as (dtype, shape, bytes), or CUDA IPC handles between processes on one GPU. A leaf
of harness.engines: the remote wrapper, the vLLM adapter and its worker extension all speak it, and none of
them imports another for it (Ray's own torch serializer breaks on some dtypes with torch 2.11)."""
from __future__ import annotations

from collections.abc import Mapping


def encode(obj, ipc: bool = False):
    """Tensors as (dtype, shape, bytes); with `ipc`, a CUDA tensor as a CUDA IPC handle instead (the receiver, a
    process on the same GPU, maps the sender's memory: no copy through the host)."""
    import torch
    if isinstance(obj, torch.Tensor):
        if ipc and obj.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor
            fn, args = reduce_tensor(obj)
            return ("__cuda_ipc__", fn, args)
        from ..formats.bytes import as_bytes
        return ("__tensor__", str(obj.dtype).removeprefix("torch."), tuple(obj.shape), as_bytes(obj.cpu()).numpy())
    if isinstance(obj, Mapping):          # also the masters made one tensor at a time (harness.lazy.LazyMap)
        return {k: encode(v, ipc) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode(v, ipc) for v in obj)
    return obj


def decode(obj):
    import torch
    if isinstance(obj, tuple) and len(obj) == 4 and obj[0] == "__tensor__":
        _, dt, shape, data = obj
        return torch.from_numpy(data.copy()).view(getattr(torch, dt)).reshape(shape)
    if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "__cuda_ipc__":
        return obj[1](*obj[2])
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(v) for v in obj)
    return obj


__all__ = ["decode", "encode"]
