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
import time

from .protocol import OPTIONAL, EngineError
from .registry import get_engine, make_engine
from .wire import decode, encode


class EngineActor:
    """Holds one engine; every call is a protocol method (or another public method of the engine)."""

    def __init__(self, kind: str, name: str, config_data: dict, spec_data: dict | None, kwargs: dict):
        from ..config import SyncConfig
        from ..models import MODELS, ModelSpec, register_model
        if spec_data and spec_data["name"] not in MODELS:     # a model registered in the driver (config.json)
            register_model(ModelSpec.from_dict(spec_data))
        self.engine = make_engine(kind, name, SyncConfig.from_dict(config_data, "engine config"), **decode(kwargs))

    def call(self, method: str, args, kwargs):
        """(status, value, when this process let go of it: `time.monotonic()`, one clock for every process of a
        host, so the caller can tell the reply's leg from the call's work)."""
        try:
            return ("ok", encode(getattr(self.engine, method)(*decode(args), **decode(kwargs))), time.monotonic())
        except Exception as e:  # noqa: BLE001 - crosses the wire as data, re-raised as EngineError by the caller
            return ("error", f"{e.__class__.__name__}: {e}", time.monotonic())

    def get(self, attr: str):
        return encode(getattr(self.engine, attr))

    def offered(self, kind: str) -> list:
        """The optional protocol methods (`OPTIONAL`) this engine has."""
        return [m for m in OPTIONAL[kind] if callable(getattr(self.engine, m, None))]

    def run_with_engine(self, fn_path: str, args, kwargs):
        """Run `module:function(engine, *args, **kwargs)` here, where the engine's tensors live (the device sync
        path runs the pipeline in the trainer's process this way). The function is named, not imported by this
        module, so the engines' layer stays below the code it runs."""
        import importlib
        mod, fn = fn_path.split(":")
        try:
            return ("ok", encode(getattr(importlib.import_module(mod), fn)(self.engine, *decode(args), **decode(kwargs))))
        except Exception as e:  # noqa: BLE001 - crosses the wire as data
            import traceback
            return ("error", f"{e.__class__.__name__}: {e} [{traceback.format_exc().strip().splitlines()[-3:]}]")

    def pid(self) -> int:
        return os.getpid()

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


class Done:
    """A call an engine in this process already ran (`start_call`): `.result()` gives its value or raises what it
    raised, as a remote call's would."""

    reply_seconds = None

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def runs_apart(engine) -> bool:
    """Whether `engine`'s calls run in another process (the remote wrapper over a Ray actor): a started call then
    returns at once, and calls started one after another run there in that order."""
    return isinstance(engine, Remote) and engine.in_ray


def start_call(engine, method: str, *args, **kwargs):
    """`engine.method(*args, **kwargs)` started: through the remote wrapper (`Remote.submit`) it returns at once
    and the engine works in its own process meanwhile; an engine in this process runs it now. `.result()` waits
    (and raises what the call raised)."""
    if callable(getattr(type(engine), "submit", None)):     # a class attribute, never a proxy's
        return engine.submit(method, *args, **kwargs)
    try:
        return Done(getattr(engine, method)(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - raised by `.result()`, where a remote call's error is
        return Done(error=e)


def offers(engine, method: str) -> bool:
    """Whether `engine` has the optional protocol method `method` (`OPTIONAL`): through the remote wrapper, what
    the engine in its process has (asked once, when the wrapper is made)."""
    if isinstance(engine, Remote):
        return method in engine.offered
    return callable(getattr(engine, method, None))


class Pending:
    """A call `Remote.submit` started."""

    reply_seconds = None     # set by `result`: from the engine's process letting go of the reply to here

    def __init__(self, remote: "Remote", ref):
        self._remote, self._ref = remote, ref

    def result(self):
        status, value, sent_at = self._remote._wait(self._ref)
        out = decode(value) if status != "error" else None
        self.reply_seconds = time.monotonic() - sent_at
        if status == "error":
            raise EngineError(value)
        return out


class Remote:
    """An engine behind the wire; attribute access returns its methods as plain synchronous calls."""

    def __init__(self, kind: str, name: str, config, *, ray: bool = False, num_gpus: float = 0.0,
                 env: dict | None = None, ipc: bool = False, _actor=None, **kwargs):
        """`ipc`: CUDA tensors in calls travel as CUDA IPC handles (engines on the same GPU)."""
        entry = get_engine(kind, name)
        self.kind, self.name, self.ipc = kind, name, ipc
        self._owner = _actor is None
        if _actor is not None:                 # attach to an engine already running (see `attach`)
            import ray as _r
            self._ray, self._actor = _r, _actor
            self._describe()
            return
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
        self._describe()

    def _describe(self):
        self.engine = self._get("engine")
        self.knobs = frozenset(self._get("knobs")) if self.kind == "rollout" else frozenset()
        a = self._actor
        self.offered = frozenset(self._wait(a.offered.remote(self.kind)) if self._ray is not None
                                 else a.offered(self.kind))

    @property
    def handle(self):
        """The Ray actor handle (another actor attaches to the same engine with `Remote.attach`)."""
        return self._actor if self._ray is not None else None

    @classmethod
    def attach(cls, kind: str, name: str, config, handle, *, ipc: bool = False) -> "Remote":
        """A second client of an engine running in a Ray actor (e.g. from inside another actor)."""
        return cls(kind, name, config, ipc=ipc, _actor=handle)

    def run_with_engine(self, fn_path: str, *args, **kwargs):
        """Run `module:function(engine, ...)` in the engine's process (see EngineActor.run_with_engine)."""
        a = self._actor
        enc_a, enc_k = encode(tuple(args)), encode(dict(kwargs))
        status, value = self._wait(a.run_with_engine.remote(fn_path, enc_a, enc_k) if self._ray is not None
                                   else a.run_with_engine(fn_path, enc_a, enc_k))
        if status == "error":
            raise EngineError(value)
        return decode(value)

    def pid(self) -> int:
        """The process the engine runs in (a released Ray engine's process exits, returning its GPU memory)."""
        a = self._actor
        return self._wait(a.pid.remote()) if self._ray is not None else a.pid()

    @property
    def in_ray(self) -> bool:
        """True when the engine runs in a Ray actor (its own process)."""
        return self._ray is not None

    def _wait(self, ref):
        return self._ray.get(ref) if self._ray is not None else ref

    def _get(self, attr):
        a = self._actor
        return decode(self._wait(a.get.remote(attr) if self._ray is not None else a.get(attr)))

    def _call(self, method, args, kwargs):
        return self.submit(method, *args, **kwargs).result()

    def submit(self, method: str, *args, **kwargs) -> "Pending":
        """Start a call and return at once: the engine works in its process while the caller goes on, and
        `.result()` waits for it (raising what the call raised). One client's calls run in the order submitted
        (Ray runs an actor's tasks from one caller in that order), so a later call runs after it."""
        if self._actor is None:
            raise EngineError(f"{self.kind} engine {self.name!r} is closed")
        a = self._actor
        enc_a, enc_k = encode(tuple(args), self.ipc), encode(dict(kwargs), self.ipc)
        return Pending(self, a.call.remote(method, enc_a, enc_k) if self._ray is not None
                       else a.call(method, enc_a, enc_k))

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *a, **k: self._call(method, a, k)

    def close(self):
        """Release the engine (a Ray actor is killed, which frees its GPU memory); idempotent."""
        a, self._actor = self._actor, None
        if a is None or not self._owner:      # an attached client leaves the engine to its owner
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


__all__ = ["Done", "EngineActor", "Remote", "decode", "encode", "offers", "runs_apart", "start_call", "start_ray"]
