"""Ray workers for the live engines: one process per trainer and per rollout engine (each with its own
environment -- Transformer Engine and vLLM read their FP8 switches at import / start), sharing the GPU by
fractional `num_gpus`. Payloads travel through Ray's object store as CPU tensors.

A worker holds exactly one engine; every method is either the sync itself or a read.
"""
from __future__ import annotations

import os

from .config import SyncConfig


# -- the wire between driver and workers -------------------------------------------------------------------------
# Ray's own torch serializer breaks on some dtypes / torch versions (seen with torch 2.11: "UntypedStorage has
# no attribute dtype"), so tensors cross as (dtype, shape, uint8 numpy bytes) and are rebuilt bit for bit.
def encode(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        from .formats.bytes import as_bytes
        return ("__tensor__", str(obj.dtype).removeprefix("torch."), tuple(obj.shape), as_bytes(obj.cpu()).numpy())
    if isinstance(obj, dict):
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


def _wire(cls):
    """Worker methods take and return wire-encoded values."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_"):
            def method(self, *a, _fn=fn, **k):
                return encode(_fn(self, *decode(a), **decode(k)))
            method.__name__ = name
            setattr(cls, name, method)
    return cls


class WireRef:
    def __init__(self, ref):
        self.ref = ref


class ActorProxy:
    """Driver-side handle: `proxy.method.remote(*args)` encodes the arguments; `RayWire.get` decodes."""

    def __init__(self, handle):
        self.handle = handle

    def __getattr__(self, name):
        m = getattr(self.handle, name)

        class _M:
            @staticmethod
            def remote(*a, **k):
                return WireRef(m.remote(*encode(a), **encode(k)))
        return _M


class RayWire:
    """`ray`-shaped: get() decodes worker results."""

    @staticmethod
    def get(x):
        import ray
        if isinstance(x, WireRef):
            return decode(ray.get(x.ref))
        if isinstance(x, list):
            return [RayWire.get(v) for v in x]
        return ray.get(x)

    @staticmethod
    def shutdown():
        import ray
        ray.shutdown()


@_wire
class TrainerWorker:
    def __init__(self, config: dict, fp8_source: str = "megatron"):
        import torch
        torch.set_num_threads(4)
        self.config = SyncConfig.from_dict(config)
        self.kind = fp8_source
        self.error = None
        if fp8_source == "megatron":
            from .engines.te_megatron import MegatronTrainer
            self.t = MegatronTrainer(self.config)
        elif fp8_source == "cpu-reference":
            from .engines.cpu.trainer import ReferenceTrainer
            self.t = ReferenceTrainer(self.config)
        else:
            raise ValueError(f"unknown trainer source {fp8_source!r}")

    def info(self) -> dict:
        import torch
        return {"kind": self.kind, "engine": self.t.engine, "step": self.t.step,
                "env": {k: os.environ.get(k) for k in ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",)},
                "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "sources": dict(getattr(self.t, "sources", {})), "loss": getattr(self.t, "last_loss", None)}

    def step(self) -> int:
        return self.t.optimizer_step()

    def export_hf(self) -> dict:
        return self.t.export_hf()

    def master_hf(self) -> dict:
        from .engines.cpu.trainer import masters_hf
        return masters_hf(self.config, self.t.step)

    def logprobs(self, prompts) -> list:
        return self.t.logprobs(prompts)


@_wire
class RolloutWorker:
    def __init__(self, config: dict, workdir: str, ignored_layers=None, gpu_memory_utilization: float = 0.12):
        self.config = SyncConfig.from_dict(config)
        from .engines.vllm import VLLMEngine
        self.e = VLLMEngine(self.config, workdir, gpu_memory_utilization=gpu_memory_utilization,
                            ignored_layers=ignored_layers)

    def ready(self) -> dict:
        return {"engine": self.e.engine, "layers": len(self.e.layers),
                "env": {k: os.environ.get(k) for k in ("VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0")}}

    def poison(self):
        return self.e.poison()

    def reload(self, items, version, post_process_repeats: int = 1, direct: bool = False):
        try:
            return {"ok": True, "record": self.e.reload_weights(items, version, post_process_repeats=post_process_repeats,
                                                                direct=direct)}
        except Exception as e:  # noqa: BLE001 - reported to the driver, which records it as the engine's refusal
            return {"ok": False, "error": f"{e.__class__.__name__}: {e}"}

    def quantize_online(self, items):
        return self.e.quantize_online(items)

    def kernel_tensors(self, names=None):
        return self.e.kernel_tensors(names)

    def device_digests(self, seeds):
        return self.e.device_digests(seeds)

    def metadata(self):
        return self.e.metadata()

    def generate_logprobs(self, prompts):
        return self.e.generate_logprobs(prompts)

    def greedy(self, prompts, max_tokens=8):
        return self.e.greedy(prompts, max_tokens)


def start_ray(num_gpus: int | None = None):
    import ray
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k.startswith(("PYTHONPATH", "NCCL_", "VLLM_", "HF_", "TRANSFORMERS_"))}
        ray.init(num_gpus=num_gpus, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": env} if env else None)
    return ray


def trainer_actor(config: SyncConfig, num_gpus: float = 0.3, fp8_source: str = "megatron"):
    ray = start_ray()
    from .engines.te_megatron import trainer_env
    return ActorProxy(ray.remote(num_gpus=num_gpus, runtime_env={"env_vars": trainer_env(config)})(TrainerWorker).remote(
        config.to_dict(), fp8_source))


def rollout_actor(config: SyncConfig, workdir: str, num_gpus: float = 0.3, ignored_layers=None):
    ray = start_ray()
    from .engines.vllm import engine_env
    return ActorProxy(ray.remote(num_gpus=num_gpus, runtime_env={"env_vars": engine_env(config)})(RolloutWorker).remote(
        config.to_dict(), workdir, ignored_layers))
