"""One remote wrapper for every engine: a registered engine built inside a Ray actor (its own process, its own
environment -- Transformer Engine and vLLM read their FP8 switches at import / start -- and a GPU fraction), or in
this process for CPU tests and laptops. Either way the calls cross the same wire (tensors as dtype + shape +
bytes: Ray's own torch serializer breaks on some dtypes with torch 2.11), so what the CPU tests exercise is what
the GPU runs.

    with Remote("rollout", "vllm", config, ray=True, num_gpus=0.3) as engine:
        engine.install(items, version)          # any protocol method, called synchronously

`close()` (or leaving the `with` block, also on error) kills the actor, which returns its GPU memory.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from .protocol import EngineError
from .registry import get_engine, make_engine


# -- the wire ---------------------------------------------------------------------------------------------------
def encode(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        from ..formats.bytes import as_bytes
        return ("__tensor__", str(obj.dtype).removeprefix("torch."), tuple(obj.shape), as_bytes(obj.cpu()).numpy())
    if isinstance(obj, Mapping):          # also the masters made one tensor at a time (harness.lazy.LazyMap)
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode(v) for v in obj)
    return obj


def decode(obj):
    import torch
    if isinstance(obj, tuple) and len(obj) == 4 and obj[0] == "__tensor__":
        _, dt, shape, data = obj
        return torch.from_numpy(data.copy()).view(getattr(torch, dt)).reshape(shape)
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(v) for v in obj)
    return obj


class EngineActor:
    """Holds one engine; every call is a protocol method (or another public method of the engine)."""

    def __init__(self, kind: str, name: str, config_data: dict, spec_data: dict | None, kwargs: dict):
        from ..config import SyncConfig
        from ..models import MODELS, ModelSpec, register_model
        if spec_data and spec_data["name"] not in MODELS:     # a model registered in the driver (config.json)
            register_model(ModelSpec.from_dict(spec_data))
        self.engine = make_engine(kind, name, SyncConfig.from_dict(config_data, "engine config"), **decode(kwargs))

    def call(self, method: str, args, kwargs):
        try:
            return ("ok", encode(getattr(self.engine, method)(*decode(args), **decode(kwargs))))
        except Exception as e:  # noqa: BLE001 - crosses the wire as data, re-raised as EngineError by the caller
            return ("error", f"{e.__class__.__name__}: {e}")

    def get(self, attr: str):
        return encode(getattr(self.engine, attr))

    def close(self):
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()
        self.engine = None
        return True


def start_ray(num_gpus: int | None = None):
    import ray
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k.startswith(("PYTHONPATH", "NCCL_", "VLLM_", "HF_", "TRANSFORMERS_",
                                                                    "TORCH_", "NVSHMEM_"))}
        ray.init(num_gpus=num_gpus, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": env} if env else None)
    return ray


class Remote:
    """An engine behind the wire; attribute access returns its methods as plain synchronous calls."""

    def __init__(self, kind: str, name: str, config, *, ray: bool = False, num_gpus: float = 0.0,
                 env: dict | None = None, **kwargs):
        entry = get_engine(kind, name)
        self.kind, self.name = kind, name
        env = {**entry.environment(config), **(env or {})}
        spec = config.spec.to_dict()
        args = (kind, name, config.to_dict(), spec, encode(kwargs))
        self._ray = None
        if ray:
            r = start_ray()
            self._ray = r
            self._actor = r.remote(num_gpus=num_gpus, runtime_env={"env_vars": env} if env else None)(
                EngineActor).remote(*args)
        else:
            os.environ.update(env)            # read by the engine's libraries at import / start
            self._actor = EngineActor(*args)
        self.engine = self._get("engine")
        self.knobs = frozenset(self._get("knobs")) if kind == "rollout" else frozenset()

    def _wait(self, ref):
        return self._ray.get(ref) if self._ray is not None else ref

    def _get(self, attr):
        a = self._actor
        return decode(self._wait(a.get.remote(attr) if self._ray is not None else a.get(attr)))

    def _call(self, method, args, kwargs):
        if self._actor is None:
            raise EngineError(f"{self.kind} engine {self.name!r} is closed")
        a = self._actor
        enc_a, enc_k = encode(tuple(args)), encode(dict(kwargs))
        status, value = self._wait(a.call.remote(method, enc_a, enc_k) if self._ray is not None
                                   else a.call(method, enc_a, enc_k))
        if status == "error":
            raise EngineError(value)
        return decode(value)

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *a, **k: self._call(method, a, k)

    def close(self):
        """Release the engine (a Ray actor is killed, which frees its GPU memory); idempotent."""
        a, self._actor = self._actor, None
        if a is None:
            return
        if self._ray is not None:
            try:
                self._ray.get(a.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - the process goes away below in any case
                pass
            self._ray.kill(a, no_restart=True)
        else:
            a.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["EngineActor", "Remote", "decode", "encode", "start_ray"]
