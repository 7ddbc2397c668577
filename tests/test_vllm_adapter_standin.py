"""fp8check's vLLM adapter code (harness/engines/vllm.py and the worker extension) run against a stand-in worker:
a torch module with vLLM 0.26's parameter names, layers with a quantization method whose post-load hook the
extension wraps, attention modules with KV-scale buffers, and an `LLM`-shaped object whose `collective_rpc`
dispatches to the extension by name. This exercises fp8check's adapter logic (RPC surface, encoding, counters,
storage watch, KV-scale pinning, knobs, sleep bookkeeping) on a laptop; it is NOT vLLM, and nothing here claims
to have talked to vLLM (tests/gpu does)."""
import sys
import types

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.vllm_extension import FP8CheckTestExtension, FP8CheckWorkerExtension


class QuantizeMethodBase:                     # what isinstance() in the extension checks for
    def process_weights_after_loading(self, layer):
        layer.post_loads = getattr(layer, "post_loads", 0) + 1


class Fp8LinearMethod(QuantizeMethodBase):    # the class names vLLM 0.26's linears carry (the settings read)
    pass


class UnquantizedLinearMethod(QuantizeMethodBase):
    pass


@pytest.fixture(autouse=True)
def fake_vllm_module(monkeypatch):
    """The vLLM imports the extension needs: the layer scan's base class, and `vllm.envs` as a process started
    with the config's environment (engine_env) resolves it."""
    mod = types.ModuleType("vllm.model_executor.layers.quantization.base_config")
    mod.QuantizeMethodBase = QuantizeMethodBase
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.quantization"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    from fp8check.harness.engines.vllm import engine_env
    env = engine_env(recommended_config("tiny-dense", "blockwise-fp32"))
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_USE_DEEP_GEMM = env["VLLM_USE_DEEP_GEMM"] == "1"
    envs.VLLM_USE_DEEP_GEMM_E8M0 = env["VLLM_USE_DEEP_GEMM_E8M0"] == "1"
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    monkeypatch.setattr(sys.modules["vllm"], "envs", envs, raising=False)
    # the release the adapter's facts are read for (harness.engines.vllm_api)
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.26.0", raising=False)


class Layer(torch.nn.Module):
    def __init__(self, fp8=True):
        super().__init__()
        self.quant_method = Fp8LinearMethod() if fp8 else UnquantizedLinearMethod()


class Attention(torch.nn.Module):
    kv_cache_dtype = "fp8_e4m3"

    def __init__(self):
        super().__init__()
        for s in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
            self.register_buffer(s, torch.tensor(3e-4))
        self.kv_cache = [torch.zeros(4)]


def standin_model(config):
    """A module tree whose named_parameters are exactly the vLLM names the layout expects."""
    root = torch.nn.Module()
    shapes = config.layout.vllm_param_shapes(0)
    fp8 = config.layout.fp8_vllm
    for name, shape in shapes.items():
        mod_name, leaf = name.rsplit(".", 1)
        if name.endswith(("w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv")):
            mod_name, leaf = name.rsplit(".", 1)
        owner = root
        for part in mod_name.split("."):
            if not hasattr(owner, part):
                owner.add_module(part, Layer(mod_name + ".weight" in fp8 or "experts" in mod_name)
                                 if part == mod_name.split(".")[-1] else torch.nn.Module())
            owner = getattr(owner, part)
        base = name[: -len("_scale_inv")] if name.endswith("_scale_inv") else name
        dt = (config.recipe.scale_dtype if name.endswith("_scale_inv") else
              (config.recipe.fp8_dtype if base in fp8 else torch.bfloat16))
        owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=dt), requires_grad=False))
    for i in range(config.spec.num_layers):
        getattr(getattr(root.model.layers, str(i)), "self_attn").add_module("attn", Attention())
    root.model.layers.get_submodule("0.self_attn").add_module("rotary_emb", torch.nn.Module())
    root.model.layers.get_submodule("0.self_attn.rotary_emb").register_buffer("cos_sin_cache", torch.zeros(8, 4))
    return root


class Runner:
    def __init__(self, config, model):
        self.config, self.model = config, model
        qc = types.SimpleNamespace(get_name=lambda: "fp8", weight_block_size=list(config.recipe.block_shape),
                                   is_checkpoint_fp8_serialized=True)
        self.vllm_config = types.SimpleNamespace(quant_config=qc)
        self.cache_config = types.SimpleNamespace(cache_dtype=config.rollout.kv_cache_dtype)

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator, is_checkpoint_format=True):
        hf = {n: t for n, t in weights_iterator}
        for n, t in self.config.layout.hf_to_vllm(hf, 0).items():
            self.model.get_parameter(n).data.copy_(t)
        for m in self.model.modules():
            if isinstance(getattr(m, "quant_method", None), QuantizeMethodBase) and list(m.parameters(recurse=False)):
                m.quant_method.process_weights_after_loading(m)


class Worker(FP8CheckTestExtension):
    def __init__(self, config):
        self.model_runner = Runner(config, standin_model(config))


class StandInLLM:
    """`collective_rpc` by method name, one worker (tensor parallel 1), like vLLM's in-process executor."""

    def __init__(self, config):
        self.worker = Worker(config)
        self.prefix_resets = 0

    def collective_rpc(self, method, args=()):
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        self.prefix_resets += 1


@pytest.fixture
def engine():
    from fp8check.harness.engines.vllm import VLLMEngine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    return VLLMEngine(cfg, llm=StandInLLM(cfg))


def test_sync_record_and_reads_through_the_extension(engine):
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.sync.pipeline import DigestFirst, run_sync
    trainer = make_engine("trainer", "cpu-reference", engine.config)
    trainer.optimizer_step()
    res = run_sync(engine.config, trainer, engine, capture=DigestFirst(), checks=True, probes=False,
                   check_ids=["S1", "S2", "S3", "S4", "S5", "S6", "S7"])
    bad = [(f.invariant_id, f.message) for f in res.findings if f.verdict != "pass"]
    assert not bad, bad
    rec = res.rollout.meta
    assert rec.post_load.kind == "identity" and rec.storage_moved == [] and rec.updates[-1].completed
    assert set(rec.updates[-1].post_process.values()) == {1}
    assert engine.llm.prefix_resets == 2            # one per install (sync and idempotence re-sync)
    assert res.fetched == 0 and res.params == len(engine.config.layout.vllm_param_shapes(0))
    # the record's reads cross as one RPC, and say where its time went (the pipeline reports it with the capture)
    calls = []
    real = engine.llm.collective_rpc
    engine.llm.collective_rpc = lambda method, args=(): calls.append(method) or real(method, args)
    rec = engine.record()
    assert calls == ["fp8check_record"], calls
    assert set(rec.seconds) == {"worker.walk", "worker.info", "worker.settings", "worker.graph", "worker.kv_scales", "rpc",
                                "build"}
    assert rec.serving.kv_scales and rec.serving.graph_storage, rec.serving
    # a digest-first capture asks for the record and the digests in that one RPC (the digests enqueued first)
    calls.clear()
    both, digests = engine.record_and_digests()
    assert calls == ["fp8check_record"], calls
    assert digests == engine.state_digests() and len(digests) == res.params
    assert {"worker.digests_launch", "worker.digests_wait"} <= set(both.seconds)
    assert {k for k in res.seconds if k.startswith("capture.record.")} == {f"capture.record.{k}" for k in both.seconds}
    calls.clear()
    run_sync(engine.config, trainer, engine, capture=DigestFirst(), checks=False, probes=False, resync=False)
    assert calls.count("fp8check_record") == 1 and "fp8check_digests" not in calls, calls


def test_knobs_turn_what_they_say(engine):
    from fp8check.harness.engines.registry import make_engine
    trainer = make_engine("trainer", "cpu-reference", engine.config)
    trainer.optimizer_step()
    items = [(n, t, 1) for n, t in trainer.export_hf().items()]
    rec = engine.install(items, 1, knobs={"post_process_repeats": 2})
    assert set(rec.post_process.values()) == {2}
    engine.install(items, 1, knobs={"detach_on_install": True})
    assert engine.record().storage_moved                          # rebinding moved storage: S7 sees it


def test_kv_scales_pinned_at_boot_and_faults_visible(engine):
    sv = engine.record().serving
    assert all(v.k == 1.0 and v.v == 1.0 for v in sv.kv_scales.values())
    assert all(v.k == pytest.approx(3e-4) for v in engine.boot_kv_scales.values())   # what the boot left
    engine.rpc("fp8check_serving_fault", {"kv_scale_placeholder": 1e-4, "realloc_buffer": True})
    sv = engine.record().serving
    assert any(v.k == pytest.approx(1e-4) for v in sv.kv_scales.values())
    assert any(n.endswith("cos_sin_cache") for n in sv.graph_storage_moved)


def test_observe_only_never_writes():
    from fp8check.harness.engines.vllm import VLLMEngine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    before = {n: b.clone() for n, b in llm.worker.model_runner.model.named_buffers()}
    eng = VLLMEngine(cfg, llm=llm, observe_only=True)
    eng.record()
    eng.state_digests()
    eng.kernel_tensors()
    after = dict(llm.worker.model_runner.model.named_buffers())
    assert all(torch.equal(before[n], after[n]) for n in before)  # KV scales not pinned on a user's engine
    assert eng.record().versions is None and eng.record().updates == []


def _user_sync(llm, trainer):
    """What a user's job does: its own reload of checkpoint-format tensors, no fp8check in the loop."""
    llm.worker.model_runner.reload_weights(iter(trainer.export_hf().items()))


def _watched_after_one_sync(llm, cfg):
    """watch(llm), then one optimizer step and the user's own sync of it; returns the trainer."""
    import fp8check
    from fp8check.harness.engines.registry import make_engine
    fp8check.watch(llm)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    _user_sync(llm, trainer)
    return trainer


@pytest.mark.parametrize("syncs", [3, 5])
def test_consecutive_correct_user_syncs_are_clean_every_time(syncs):
    """watch + check_sync after each of several correct syncs: S7 passes each time (post-load once per sync; the
    counters used to accumulate: 'post-load ran 2 times' from the second sync on)."""
    import fp8check
    from fp8check.harness.engines.registry import make_engine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    fp8check.watch(llm)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    for _ in range(syncs):
        trainer.optimizer_step()
        _user_sync(llm, trainer)
        findings = fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return")
        s7 = [f for f in findings if f.invariant_id == "S7"]
        assert [f.verdict for f in s7] == ["pass"], [(f.verdict, f.message) for f in s7]
        assert not [f for f in findings if f.verdict != "pass"], [(f.invariant_id, f.message) for f in findings
                                                                 if f.verdict != "pass"]


def test_an_observed_sync_that_post_processes_twice_is_still_caught():
    import fp8check
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    trainer = _watched_after_one_sync(llm, cfg)
    assert not [f for f in fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return") if f.verdict == "fail"]
    trainer.optimizer_step()
    _user_sync(llm, trainer)
    _user_sync(llm, trainer)                       # the job reloads twice: post-load twice for one sync
    s7 = [f for f in fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return") if f.invariant_id == "S7"]
    assert any(f.verdict == "fail" and "ran 2 times" in f.message for f in s7), [(f.verdict, f.message) for f in s7]


READ_ONLY = {"fp8check_counts", "fp8check_counts_since", "fp8check_digests", "fp8check_graph_moved", "fp8check_info",
             "fp8check_instrument", "fp8check_kv_scales", "fp8check_read", "fp8check_record", "fp8check_rewatch_graph",
             "fp8check_settings", "fp8check_warm"}


def test_the_users_extension_only_reads():
    """What a user adds to their engine has exactly the reading methods, and calling every one of them leaves
    every parameter and buffer byte as it was; the writing ones live in the test extension."""
    public = {m for m in vars(FP8CheckWorkerExtension) if m.startswith("fp8check_")}
    assert public == READ_ONLY, sorted(public ^ READ_ONLY)
    writes = {m for m in vars(FP8CheckTestExtension) if m.startswith("fp8check_")}
    assert {"fp8check_poison", "fp8check_reload", "fp8check_serving_fault", "fp8check_pin_kv_scales"} <= writes

    class UserWorker(FP8CheckWorkerExtension):
        def __init__(self, config):
            self.model_runner = Runner(config, standin_model(config))
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    w = UserWorker(cfg)
    model = w.model_runner.model
    before = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    for m in ["fp8check_instrument"] + sorted(READ_ONLY):      # watch first, as a user does
        getattr(w, m)()
    after = dict(list(model.named_parameters()) + list(model.named_buffers()))
    assert all(torch.equal(before[n].reshape(-1).view(torch.uint8), after[n].detach().reshape(-1).view(torch.uint8))
               for n in before)


def test_an_engine_without_the_extension_is_one_line_naming_it():
    import fp8check
    from fp8check.harness.engines.vllm import MissingExtension

    class Bare:
        def collective_rpc(self, method, args=()):
            raise AttributeError(f"'Worker' object has no attribute '{method}'")
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    with pytest.raises(MissingExtension) as e:
        fp8check.check_sync(Bare(), {}, cfg)
    msg = str(e.value)
    assert "fp8check_instrument" in msg and "worker_extension_cls=fp8check.WORKER_EXTENSION" in msg
    assert "\n" not in msg


def test_settings_are_read_from_the_engine_and_a_mismatch_is_c10_naming_the_variable(monkeypatch):
    """A user's engine whose process resolved vLLM 0.26's default (DeepGEMM with E8M0 on) while the config's
    FP32 scales need it off: the record's settings come from the engine, and the first finding names the
    variable (the byte checks, judged against the engine's real UE8M0 transform, follow)."""
    import fp8check
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    trainer = _watched_after_one_sync(llm, cfg)
    clean = fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return")
    assert [f.verdict for f in clean if f.invariant_id == "C10"] == ["pass"]
    monkeypatch.setattr(sys.modules["vllm.envs"], "VLLM_USE_DEEP_GEMM", True)
    monkeypatch.setattr(sys.modules["vllm.envs"], "VLLM_USE_DEEP_GEMM_E8M0", True)
    from fp8check.harness.engines.vllm import VLLMEngine
    rec = VLLMEngine(cfg, llm=llm, observe_only=True).record()
    assert rec.settings["ue8m0_requant"] is True and rec.settings["read_from_engine"] is True
    assert rec.post_load.kind == "ue8m0_requant" and rec.act_quant == "vllm-ue8m0"
    findings = fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return")
    first = next(f for f in findings if f.verdict == "fail")
    assert first.invariant_id == "C10" and "VLLM_USE_DEEP_GEMM_E8M0=1" in first.message \
        and "needs VLLM_USE_DEEP_GEMM_E8M0=0" in first.message


@pytest.mark.parametrize("method", ["AWQMethod", "GPTQMarlinLinearMethod"])
def test_an_engine_fp8check_cannot_judge_is_one_line_and_left_untouched(method):
    """A quantization method the settings reader does not know: one line naming it and what to do, and the
    engine's state and hooks stay as they were."""
    import fp8check
    from fp8check.harness.engines.vllm import UnsupportedEngine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    for m in llm.worker.model_runner.model.modules():
        if isinstance(getattr(m, "quant_method", None), QuantizeMethodBase):
            m.quant_method = type(method, (QuantizeMethodBase,), {})()
    before = {n: t.clone() for n, t in llm.worker.model_runner.model.state_dict().items()}
    with pytest.raises(UnsupportedEngine) as e:
        fp8check.check_sync(llm, {}, cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("check_sync: the engine")
    assert method in msg, msg
    assert "_fp8check_state" not in llm.worker.__dict__            # nothing instrumented
    after = llm.worker.model_runner.model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize("cls,method", [("Fp8PerBlockOnlineLinearMethod", "fp8-online-per-block"),
                                        ("Fp8PerTensorOnlineLinearMethod", "fp8-online-per-tensor")])
def test_an_online_engine_under_a_checkpoint_config_is_c10_naming_the_method(cls, method):
    """vllm.LLM(quantization="fp8_per_block") and, on a BF16 checkpoint, quantization="fp8" are judged (their rules
    are modelled); a config that planned a checkpoint engine gets C10 first, naming the method."""
    import fp8check
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    llm = StandInLLM(cfg)
    for m in llm.worker.model_runner.model.modules():
        if isinstance(getattr(m, "quant_method", None), Fp8LinearMethod):
            m.quant_method = type(cls, (QuantizeMethodBase,), {})()
    trainer = _watched_after_one_sync(llm, cfg)
    findings = fp8check.check_sync(llm, trainer.export_hf(), cfg, on_fail="return")
    first = next(f for f in findings if f.verdict == "fail")
    assert (first.invariant_id, first.tensor) == ("C10", "method"), first
    assert f"'{method}'" in first.message and "'fp8-block'" in first.message


def test_online_per_tensor_layers_are_read_in_checkpoint_orientation():
    """vLLM's Fp8PerTensorOnline*Method layers as they hold their tensors: a linear's codes as the transpose of a
    contiguous [N, K] tensor (the CUTLASS kernel's column-major B, an 8-row router padded to 16), one
    `weight_scale` [1]; experts [E, N, K] with `weight_scale` [E]. The extension reads them as [N, K] codes (no
    copy) and `weight_scale_inv` ([1]; [E, 1]), and leaves the engine's parameters as they were."""
    from fp8check.harness.engines.wire import decode
    root, g = torch.nn.Module(), torch.Generator().manual_seed(0)

    def fp8(*shape):
        return (torch.randn(*shape, generator=g) * 20).to(torch.float8_e4m3fn)

    lin = torch.nn.Module()
    lin.quant_method = type("Fp8PerTensorOnlineLinearMethod", (QuantizeMethodBase,), {})()
    codes = fp8(24, 32)                                          # [N, K]
    lin.weight = torch.nn.Parameter(codes.t(), requires_grad=False)
    lin.weight_scale = torch.nn.Parameter(torch.tensor([0.5]), requires_grad=False)
    lin.output_size_per_partition, lin.input_size_per_partition = 24, 32
    router = torch.nn.Module()
    router.quant_method = type("Fp8PerTensorOnlineLinearMethod", (QuantizeMethodBase,), {})()
    padded = fp8(16, 32)                                         # 8 rows padded to 16 by the kernel
    router.weight = torch.nn.Parameter(padded.t(), requires_grad=False)
    router.weight_scale = torch.nn.Parameter(torch.tensor([0.25]), requires_grad=False)
    router.output_size_per_partition, router.input_size_per_partition = 8, 32
    moe = torch.nn.Module()
    moe.quant_method = type("Fp8PerTensorOnlineMoEMethod", (QuantizeMethodBase,), {})()
    w13 = fp8(4, 16, 32)
    moe.w13_weight = torch.nn.Parameter(w13, requires_grad=False)
    moe.w13_weight_scale = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]), requires_grad=False)
    root.add_module("qkv_proj", lin), root.add_module("gate", router), root.add_module("experts", moe)

    class W(FP8CheckWorkerExtension):
        def __init__(self):
            self.model_runner = types.SimpleNamespace(get_model=lambda: root)
    got = decode(W().fp8check_read())
    assert torch.equal(got["qkv_proj.weight"].view(torch.uint8), codes.view(torch.uint8))
    assert got["qkv_proj.weight_scale_inv"].tolist() == [0.5] and "qkv_proj.weight_scale" not in got
    assert torch.equal(got["gate.weight"].view(torch.uint8), padded[:8].view(torch.uint8))
    assert torch.equal(got["experts.w13_weight"].view(torch.uint8), w13.view(torch.uint8))
    assert got["experts.w13_weight_scale_inv"].tolist() == [[1.0], [2.0], [3.0], [4.0]]
    assert tuple(lin.weight.shape) == (32, 24) and tuple(moe.w13_weight_scale.shape) == (4,)   # untouched


def test_the_records_one_walk_is_what_named_parameters_and_buffers_give_and_lasts_one_record():
    """The record's reads share one walk of the module list: the same names and tensors as `named_parameters()`
    and `named_buffers()` (a tied tensor under its first name only), taken afresh by each record: a parameter
    rebound or a KV scale written between records is what the next one reads."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    worker = Worker(cfg)
    model = worker.model_runner.model
    tied = model.get_submodule("model.layers.0.self_attn.qkv_proj")
    model.add_module("tied_head", torch.nn.Module())
    model.tied_head.register_parameter("weight", tied.weight)               # as lm_head ties the embedding
    model.get_submodule("model.layers.1.self_attn.attn").register_buffer("_k_scale", torch.tensor([2.0, 9.0]))
    params, buffers = worker._fp8check_tensors()
    assert list(params) == [n for n, _ in model.named_parameters()] and "tied_head.weight" not in params
    assert all(params[n] is p for n, p in model.named_parameters())
    assert list(buffers) == [n for n, _ in model.named_buffers()]
    worker.fp8check_instrument()
    first = worker.fp8check_record(True, False)
    assert worker._fp8check()["walk"] is None and worker._fp8check()["params"] is None
    assert first["kv_scales"]["model.layers.1.self_attn.attn"]["k"] == 2.0      # a many-element scale: its first
    name = "model.layers.0.mlp.down_proj.weight"
    old = model.get_parameter(name)
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    owner.register_parameter("weight", torch.nn.Parameter(old.detach().clone(), requires_grad=False))
    model.get_submodule("model.layers.0.self_attn.attn")._v_scale.fill_(0.5)
    second = worker.fp8check_record(True, False)
    assert second["info"][name]["moved"] and not first["info"][name]["moved"]
    assert second["info"][name]["ptr"] == owner.weight.data_ptr() != first["info"][name]["ptr"]
    assert second["kv_scales"]["model.layers.0.self_attn.attn"]["v"] == 0.5
    assert second["digests"][name] == first["digests"][name]                  # the same bytes, new storage
    assert [n for n in second["graph"][1]] == [name]                            # the graphs' storage moved


def test_a_record_whose_reads_fail_leaves_no_walk_behind(monkeypatch):
    """The walk is the record's alone: a read that raises (here the online-orientation pass) leaves nothing a later
    read would take for the engine's state now."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    worker = Worker(cfg)
    worker.fp8check_instrument()
    monkeypatch.setattr(Worker, "_fp8check_params", lambda self: (_ for _ in ()).throw(RuntimeError("mid-reload")))
    with pytest.raises(RuntimeError, match="mid-reload"):
        worker.fp8check_record(True, None)
    assert worker._fp8check()["walk"] is None and worker._fp8check()["params"] is None


def test_a_parameter_left_on_meta_is_digested_by_its_dtype_and_shape():
    """A layer whose reload never finished holds meta parameters: the worker's digests name them by dtype and
    shape (S1 and S7 read that), beside the real digests of the others."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    worker = Worker(cfg)
    model = worker.model_runner.model
    name = "model.layers.0.mlp.down_proj.weight"
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    shape, dtype = tuple(owner.weight.shape), owner.weight.dtype
    owner.register_parameter("weight", torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"),
                                                          requires_grad=False))
    got = worker.fp8check_digests()
    assert got[name] == f"meta:{str(dtype).removeprefix('torch.')}:{shape[0]}x{shape[1]}"
    assert all(d.startswith("fx:") for n, d in got.items() if n != name)
    assert worker.fp8check_record(True, False)["digests"][name] == got[name]
