"""rollout.install=weight_source: fp8check's payload as vLLM's own `WeightSource` and the client log that drives and
observes vLLM's trainer-side transfer (harness.engines.vllm_transfer).

* The source against vLLM's real `WeightSource` / `ParamMeta` classes, loaded from each release's
  distributed/weight_transfer/base.py text (/tmp/src or the wheel; its two config imports stubbed): vLLM's own
  subclass checks run on fp8check's class.
* The adapter through a stand-in worker (tests/test_vllm_adapter_standin.py) and a stand-in of vLLM's IPC trainer
  engine with vLLM's call sequence (start, update, finish on the client): fp8check's driving, observing and judging,
  not vLLM's CUDA IPC (tests/gpu runs that)."""
import dataclasses
import sys
import types

import pytest
import torch

from fp8check.harness.engines.vllm_api import facts_for
from fp8check.harness.engines.vllm_transfer import ObservedClient, weight_source
from test_vllm_adapter_standin import StandInLLM, fake_vllm_module  # noqa: F401 - the autouse fixture
from test_vllm_api import read

BASE = "vllm/distributed/weight_transfer/base.py"


def vllm_base(version):
    """vLLM `version`'s weight_transfer/base.py as a module (its config imports are type annotations: stubbed)."""
    text = read(version, BASE)
    stubs = {"vllm.config": types.ModuleType("vllm.config"),
             "vllm.config.parallel": types.ModuleType("vllm.config.parallel"),
             "vllm.config.weight_transfer": types.ModuleType("vllm.config.weight_transfer")}
    stubs["vllm.config.parallel"].ParallelConfig = type("ParallelConfig", (), {})
    stubs["vllm.config.weight_transfer"].WeightTransferConfig = type("WeightTransferConfig", (), {})
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        mod = types.ModuleType(f"vllm_base_{version.replace('.', '_')}")
        mod.__file__ = f"{version}/{BASE}"
        sys.modules[mod.__name__] = mod        # dataclasses resolve their module by name
        exec(compile(text, mod.__file__, "exec"), mod.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


ITEMS = [("model.layers.0.mlp.down_proj.weight", torch.zeros(4, 8, dtype=torch.float8_e4m3fn)),
         ("model.layers.0.mlp.down_proj.weight_scale_inv", torch.ones(1, 1)),
         ("model.norm.weight", torch.ones(8, dtype=torch.bfloat16))]


def _pairs(it):
    return [(n, tuple(t.shape), t.dtype) for n, t in it]


@pytest.mark.parametrize("version", ["0.27.0", "0.30.0", "0.32.0"])
def test_source_as_vllm_iterates_it_before_0_33(version):
    base = vllm_base(version)
    src = weight_source(base.WeightSource, base.ParamMeta, facts_for(version).weight_source_form, ITEMS)
    assert isinstance(src, base.WeightSource)
    assert [(m.name, m.shape, m.dtype) for m in src.metadata()] == _pairs(ITEMS)
    assert _pairs(src) == _pairs(ITEMS) and _pairs(src) == _pairs(ITEMS)        # a fresh pass each round


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_source_as_vllm_iterates_it_from_0_33(version):
    base = vllm_base(version)
    src = weight_source(base.WeightSource, base.ParamMeta, facts_for(version).weight_source_form, ITEMS)
    assert src.implements_iter_full() and not src.implements_iter_local()
    assert src.owned_names(0) == [n for n, _ in ITEMS]                  # what IPC's trainer_init checks
    assert [(m.name, m.shape, m.dtype) for m in src.metadata] == _pairs(ITEMS)
    assert _pairs(src.iter_full()) == _pairs(ITEMS)
    # the other release's form is what vLLM's own subclass check refuses: the fact decides which one is built
    with pytest.raises(TypeError, match="cached_property"):
        weight_source(base.WeightSource, base.ParamMeta, "iter", ITEMS)


def test_client_log_problems():
    calls = []
    c = ObservedClient(lambda m, *a: calls.append(m))
    c.init_weight_transfer_engine({"packed": False})
    c.start_weight_update()
    c.update_weights({"names": ["a", "b"]})
    c.finish_weight_update()
    assert calls == ["init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update"]
    assert c.problems(["a", "b"]) == []
    assert c.problems(["a", "b", "c"]) == ["vLLM's weight transfer carried 2 of 3 tensors (first missing: c)"]
    late = ObservedClient(lambda m, *a: None)
    late.update_weights([{"names": ["a"]}, {"names": ["a"]}])
    late.finish_weight_update()
    assert [p.split(":")[0] for p in late.problems(["a"])] == [
        "vLLM's weight transfer did not run start, update(s), finish once",
        "vLLM's weight transfer carried 1 tensors more than once (first"]


# -- the adapter, install=weight_source, through stand-ins ---------------------------------------------------------
@dataclasses.dataclass
class InitInfo:
    packed: bool = False
    rank: int = 0


def standin_ipc(drop: str | None = None):
    """vLLM's IPCTrainerWeightTransferEngine's call sequence (ipc_engine.py: trainer_init ships `packed`, then
    send_weights runs start, one update carrying every name, finish), the tensors carried as they are instead of
    as CUDA IPC handles. `drop`: a sender that leaves one tensor out."""
    class Engine:
        def __init__(self, client, source):
            self.client, self.source = client, source

        @classmethod
        def trainer_init(cls, init_info, *, client, source=None):
            client.init_weight_transfer_engine({"packed": init_info.packed})
            return cls(client, source)

        def send_weights(self):
            self.client.start_weight_update()
            pairs = [(n, t) for n, t in self.source.iter_full() if n != drop]
            self.client.update_weights({"names": [n for n, _ in pairs], "tensors": [t for _, t in pairs]})
            self.client.finish_weight_update()
    mod = types.ModuleType("vllm.distributed.weight_transfer.ipc_engine")
    mod.IPCTrainerWeightTransferEngine, mod.IPCTrainerInitInfo = Engine, InitInfo
    return mod


def _receiving_worker(worker):
    """The worker side of vLLM's transfer on the stand-in worker: start, update (the carried tensors), finish (one
    reload of what arrived, as vLLM's IPC receiver loads into a layerwise reload)."""
    def start():
        worker._wt = []
    def update(info):
        worker._wt.extend(zip(info["names"], info["tensors"]))
    def finish():
        worker.model_runner.reload_weights(iter(worker._wt))
    worker.init_weight_transfer_engine = lambda info: None
    worker.start_weight_update, worker.update_weights, worker.finish_weight_update = start, update, finish


@pytest.fixture
def transfer_modules(monkeypatch):
    def install(drop=None):
        base = vllm_base("0.34.0")
        pkg = types.ModuleType("vllm.distributed.weight_transfer")
        pkg.base, pkg.ipc_engine = base, standin_ipc(drop)
        monkeypatch.setitem(sys.modules, "vllm.distributed", types.ModuleType("vllm.distributed"))
        monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer", pkg)
        monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.base", base)
        monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.ipc_engine", pkg.ipc_engine)
    return install


def _engine(install_path="weight_source", version="0.34.0"):
    from dataclasses import replace
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.vllm import VLLMEngine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(cfg, rollout=replace(cfg.rollout, install=install_path))
    llm = StandInLLM(cfg)
    _receiving_worker(llm.worker)
    return VLLMEngine(cfg, llm=llm, facts=facts_for(version))


def _sync(engine):
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.sync.pipeline import run_sync
    trainer = make_engine("trainer", "cpu-reference", engine.config)
    trainer.optimizer_step()
    return run_sync(engine.config, trainer, engine, checks=True, probes=False,
                    check_ids=["S1", "S2", "S3", "S4", "S5", "S6", "S7"])


def test_weight_source_sync_is_judged_green(transfer_modules):
    transfer_modules()
    engine = _engine()
    res = _sync(engine)
    bad = [(f.invariant_id, f.message) for f in res.findings if f.verdict != "pass"]
    assert not bad, bad
    assert engine.engine == "vllm-0.34.0"
    assert res.rollout.meta.reload.mode == "layerwise"


def test_weight_source_sender_that_drops_a_tensor_fails_s7_and_s1(transfer_modules):
    transfer_modules(drop="model.layers.0.mlp.down_proj.weight_scale_inv")
    res = _sync(_engine())
    s7 = [f.message for f in res.findings if f.invariant_id == "S7" and f.verdict == "fail"]
    assert any("carried" in m and "first missing: model.layers.0.mlp.down_proj.weight_scale_inv" in m for m in s7), s7
    assert "S1" in res.fired                # the poisoned scale survived: no sync wrote it


def test_weight_source_needs_a_release_with_the_trainer_engine():
    from fp8check.harness.engines.vllm import UnsupportedEngine
    with pytest.raises(UnsupportedEngine, match="rollout.install=weight_source: vLLM 0.26.0 has no trainer-side"):
        _engine(version="0.26.0")
