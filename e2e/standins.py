"""CPU stand-ins for the Ray workers: the same method surface as harness.ray_workers, backed by the CPU
reference engines, plus a `ray`-shaped shim that calls them in-process. They let the live driver's logic
(payloads, faults, digest-first capture, checks) run on a laptop; they are not live engines and nothing
that uses them claims to have talked to vLLM or Transformer Engine."""
from __future__ import annotations

from harness.config import SyncConfig
from harness.engines.cpu.rollout import ReferenceRollout
from harness.engines.cpu.trainer import ReferenceTrainer
from harness.engines.digest import device_digest
from harness.layouts import scale_name


class _Method:
    def __init__(self, fn):
        self.remote = fn


class _Handle:
    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return _Method(getattr(self._obj, name))


class InProcessRay:
    @staticmethod
    def get(x):
        return x


class CPUTrainerWorker:
    def __init__(self, config: SyncConfig):
        self.t = ReferenceTrainer(config)

    def info(self):
        return {"kind": "cpu-reference", "engine": self.t.engine, "step": self.t.step, "sources": {}}

    def step(self):
        return self.t.optimizer_step()

    def export_hf(self):
        return self.t.export_hf()

    def master_hf(self):
        return self.t.master_hf()

    def logprobs(self, prompts):
        return self.t.logprobs(prompts)


class CPURolloutWorker:
    def __init__(self, config: SyncConfig, ignored_layers=None):
        self.e = ReferenceRollout(config, ignored_layers=ignored_layers)
        self.poisoned = False

    def ready(self):
        return {"engine": self.e.engine, "layers": None, "env": {}}

    def poison(self):
        self.poisoned = True
        return self.e.poison()

    def reload(self, items, version, post_process_repeats=1, direct=False):
        self.e.post_process_repeats = post_process_repeats
        try:
            rec = self.e.reload_weights(items, version, direct=direct)
            return {"ok": True, "record": rec.to_json()}
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
        finally:
            self.e.post_process_repeats = 1

    def quantize_online(self, items):
        from harness.engines.vllm_numerics import vllm_online_quant
        out = []
        for n, t, v in items:
            if n in self.e.config.fp8_tensors:
                q, s = vllm_online_quant(t, self.e.recipe)
                out += [(n, q, v), (scale_name(n), s, v)]
            else:
                out.append((n, t, v))
        return out

    def kernel_tensors(self, names=None):
        kt = self.e.kernel_tensors()
        return {k: v for k, v in kt.items() if names is None or k in names}

    def device_digests(self, seeds):
        return {k: device_digest(v, seeds) for k, v in self.e.kernel_tensors().items()}

    def metadata(self):
        m = self.e.metadata()
        m["poisoned"] = self.poisoned
        return m

    def generate_logprobs(self, prompts):
        return self.e.generate_logprobs(prompts)


def cpu_session(config: SyncConfig, ignored_layers=None):
    from .live import LiveSession
    return LiveSession(config, "", trainer=_Handle(CPUTrainerWorker(config)),
                       rollout=_Handle(CPURolloutWorker(config, ignored_layers)), ray_module=InProcessRay)
