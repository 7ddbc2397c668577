"""The bad-input corpus: hundreds of malformed manifests, snapshots, job configs, model configs and command lines,
generated (Hypothesis-style enumeration with fixed seeds, faker for realistic names and values). Each must end in
exit 2 with one short line naming the file / key / tensor, or in an honest exit 1 with a FAIL finding, and never
in a traceback, an "internal error" or a silent pass."""
import contextlib
import copy
import io
import json
import os
import random

import pytest
import torch
import yaml
from faker import Faker
from safetensors.torch import load_file, save_file

from fp8check.harness.cli import main

HOPPER = "examples/skyrl_hopper_fp8.yaml"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_clean_failure(rc, err, *needles, allow=(2,)):
    assert rc in allow, (rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and len(lines[0]) < 400, err
        for n in needles:
            assert n in err, (n, err)


@pytest.fixture(scope="module")
def snapdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("snap") / "good"
    rc, _, err = run(["snapshot", "--model", "tiny-dense", "--recipe", "blockwise-fp32", "--out", str(d)])
    assert rc == 0, err
    rc, _, err = run(["verify", str(d)])
    assert rc == 0, err
    return d


def clone(src, dst, *writable):
    """A copy of the snapshot in which only the manifest and the files named in `writable` are real copies; the
    other tensor files are symlinks to the fixture's. A full copy per case wrote ~56 MB x 300 cases = 13 GB and
    filled the CI runner's disk (every later test then errored at set-up)."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f == "manifest.json" or f in writable:
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
                b.write(a.read())
        else:
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    return dst


def paths(obj, prefix=(), depth=0):
    """Every key path into the manifest (first list element only), up to depth 4."""
    if depth > 4:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from paths(v, prefix + (k,), depth + 1)
    elif isinstance(obj, list) and obj:
        yield prefix + (0,)
        yield from paths(obj[0], prefix + (0,), depth + 1)


def mutate(manifest, path, how):
    m = copy.deepcopy(manifest)
    cur = m
    for p in path[:-1]:
        cur = cur[p]
    last = path[-1]
    if how == "delete":
        if isinstance(cur, dict):
            del cur[last]
        else:
            cur.pop(last)
    else:
        cur[last] = {"list": [1, "x"], "string": "lots", "int": -7, "null": None, "mapping": {"x": 1},
                     "float": 0.5, "bool": True}[how]
    return m


MUTATIONS = ("delete", "list", "string", "int", "null", "mapping", "bool")


def _manifest_cases():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # a deterministic sample of (path, mutation) over a manifest made the same way the fixture makes it
    from fp8check.harness.config import recommended_config
    from fp8check.harness.snapshot import snapshot_manifest
    from fp8check.harness.sync.pipeline import reference_sync
    res, _, _ = reference_sync(recommended_config("tiny-dense", "blockwise-fp32"), checks=False)
    snaps = dict(master=res.master, trainer=res.trainer, payload=res.payload, rollout=res.rollout)
    m = snapshot_manifest(res.config, res.version, **snaps)
    all_paths = sorted(set(paths(m)), key=str)
    rnd = random.Random(1234)
    cases = [(p, h) for p in all_paths for h in MUTATIONS]
    rnd.shuffle(cases)
    del here
    return cases[:160]


MANIFEST_CASES = _manifest_cases()


@pytest.mark.parametrize("path,how", MANIFEST_CASES, ids=[f"{'.'.join(map(str, p))}:{h}" for p, h in MANIFEST_CASES])
def test_malformed_manifest(snapdir, tmp_path, path, how):
    d = clone(snapdir, tmp_path / "s")
    mp = os.path.join(d, "manifest.json")
    m = json.load(open(mp))
    try:
        m2 = mutate(m, path, how)
    except (KeyError, IndexError, TypeError):
        pytest.skip("path does not exist in this manifest")
    json.dump(m2, open(mp, "w"))
    rc, out, err = run(["verify", str(d), "--json"])
    # schema-valid edits run the catalog (0 or 1: an honest verdict); invalid ones are bad input naming the key
    assert_clean_failure(rc, err, "manifest.json", allow=(0, 1, 2))
    if rc in (0, 1):
        assert "check raised" not in out, out[:2000]


def test_manifest_type_errors_name_the_key(snapdir, tmp_path):
    cases = [(("rollout",), "list", "rollout"), (("payload",), "string", "payload"), (("rollout", "updates"), "int",
             "rollout.updates"), (("rollout", "updates", 0), "null", "rollout.updates[0]"),
             (("rollout", "ignored_layers"), "int", "rollout.ignored_layers"), (("digests",), "list", "digests"),
             (("trainer",), "int", "trainer"), (("config",), "list", "config")]
    for path, how, key in cases:
        d = clone(snapdir, tmp_path / f"s-{'-'.join(map(str, path))}")
        mp = os.path.join(d, "manifest.json")
        json.dump(mutate(json.load(open(mp)), path, how), open(mp, "w"))
        rc, _, err = run(["verify", str(d)])
        assert_clean_failure(rc, err, "manifest.json", key)


@pytest.mark.parametrize("reload,key", [({"mode": "sideways"}, "reload mode 'sideways'"),
                                        ({"mode": "direct", "rollback": "no"}, "rollout.reload.rollback"),
                                        ("direct", "rollout.reload")])
def test_a_bad_reload_declaration_names_the_key(snapdir, tmp_path, reload, key):
    d = clone(snapdir, tmp_path / "s")
    mp = os.path.join(d, "manifest.json")
    m = json.load(open(mp))
    m["rollout"]["reload"] = reload
    json.dump(m, open(mp, "w"))
    rc, _, err = run(["verify", str(d)])
    assert_clean_failure(rc, err, "manifest.json", key)


def _edit_rollout(d, fn):
    p = os.path.join(d, "rollout.safetensors")
    t = load_file(p)
    fn(t)
    save_file(t, p)


def test_missing_engine_parameter_is_coverage(snapdir, tmp_path):
    d = clone(snapdir, tmp_path / "s", "rollout.safetensors")
    _edit_rollout(d, lambda t: t.pop("model.layers.0.self_attn.qkv_proj.weight"))
    rc, out, err = run(["verify", str(d), "--json"])
    rep = json.loads(out)
    s1 = [f for f in rep["findings"] if f["invariant_id"] == "S1" and f["verdict"] == "fail"]
    assert rc == 1 and any(f["tensor"] == "model.layers.0.self_attn.qkv_proj.weight" and "is absent" in f["message"]
                           for f in s1), s1
    assert "check raised" not in out


def test_unknown_engine_parameter_is_coverage(snapdir, tmp_path):
    d = clone(snapdir, tmp_path / "s", "rollout.safetensors")
    _edit_rollout(d, lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", torch.zeros(4, 4)))
    rc, out, _ = run(["verify", str(d), "--json"])
    rep = json.loads(out)
    assert rc == 1 and any("which no trainer tensor maps to" in f["message"] for f in rep["findings"]
                           if f["invariant_id"] == "S1" and f["verdict"] == "fail")


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.qkv_proj.weight",
                                  "model.layers.0.self_attn.qkv_proj.weight_scale_inv",
                                  "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"])
def test_scalar_where_a_matrix_belongs_never_raises(snapdir, tmp_path, name):
    d = clone(snapdir, tmp_path / "s", "rollout.safetensors")
    _edit_rollout(d, lambda t: t.__setitem__(name, torch.zeros((), dtype=t[name].dtype)))
    rc, out, err = run(["verify", str(d), "--json"])
    assert rc == 1 and "check raised" not in out and "Traceback" not in err
    assert any(f["verdict"] == "fail" for f in json.loads(out)["findings"])


@pytest.mark.parametrize("name", ["model.layers.1.mlp.down_proj.weight", "model.norm.weight"])
def test_missing_engine_tensor_is_named_by_s1(snapdir, tmp_path, name):
    d = clone(snapdir, tmp_path / "s", "rollout.safetensors")
    _edit_rollout(d, lambda t: t.pop(name))
    rc, out, _ = run(["verify", str(d), "--json"])
    s1 = [f for f in json.loads(out)["findings"] if f["invariant_id"] == "S1" and f["verdict"] == "fail"]
    assert rc == 1 and [f["tensor"] for f in s1 if "is absent" in f["message"]] == [name], s1


def test_master_without_model_tensors_is_a_bad_snapshot(snapdir, tmp_path):
    d = clone(snapdir, tmp_path / "s", "master.safetensors")
    save_file({"junk": torch.zeros(2)}, os.path.join(d, "master.safetensors"))
    rc, _, err = run(["verify", str(d), "--json"])
    assert_clean_failure(rc, err, "master.safetensors", "holds none of tiny-dense's tensors")


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_norm.weight", "model.layers.0.mlp.down_proj.weight"])
def test_master_of_the_wrong_shape_is_a_bad_snapshot(snapdir, tmp_path, name):
    d = clone(snapdir, tmp_path / "s", "master.safetensors")
    p = os.path.join(d, "master.safetensors")
    t = load_file(p)
    want = list(t[name].shape)
    t[name] = t[name][:-1].contiguous()
    save_file(t, p)
    rc, _, err = run(["verify", str(d)])
    assert_clean_failure(rc, err, "master.safetensors", repr(name), f"needs {want}")


def test_snapshot_of_a_future_format_is_refused(snapdir, tmp_path):
    d = clone(snapdir, tmp_path / "s")
    mp = os.path.join(d, "manifest.json")
    m = json.load(open(mp))
    m["format_version"] += 1
    json.dump(m, open(mp, "w"))
    rc, _, err = run(["verify", str(d)])
    assert_clean_failure(rc, err, "manifest.json", f"format_version {m['format_version']} is not supported",
                         f"reads {m['format_version'] - 1}")


@pytest.mark.parametrize("fname", ["manifest.json", "rollout.safetensors", "trainer.safetensors",
                                   "payload.safetensors", "master.safetensors"])
@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "garbage"])
def test_damaged_snapshot_files(snapdir, tmp_path, fname, damage):
    d = clone(snapdir, tmp_path / "s", fname)
    p = os.path.join(d, fname)
    data = open(p, "rb").read()
    if damage == "missing":
        os.remove(p)
    else:
        open(p, "wb").write({"empty": b"", "truncated": data[: len(data) // 2],
                             "garbage": os.urandom(256)}[damage])
    rc, _, err = run(["verify", str(d)])
    assert_clean_failure(rc, err, fname)


FAKE = Faker()
Faker.seed(11)


def _job_cases():
    out = [
        ("random bytes", os.urandom(64) + b"\xff\xfe", None, "not a UTF-8"),
        ("seed not a number", {"fp8check.seed": "abc"}, None, "fp8check.seed"),
        ("negative seed", {"fp8check.seed": -3}, None, "fp8check.seed"),
        ("tp 0", {"trainer.policy.megatron_config.tensor_model_parallel_size": 0}, None,
         "trainer.policy.megatron_config.tensor_model_parallel_size"),
        ("rollout tp -1", {"generator.inference_engine.tensor_parallel_size": -1}, None,
         "generator.inference_engine.tensor_parallel_size"),
        ("packing lots", {"fp8check.packing.replay_multiple": "lots"}, None, "fp8check.packing.replay_multiple"),
        ("block size lots", {"generator.inference_engine.engine_init_kwargs.hf_overrides.quantization_config."
                             "weight_block_size": [128, "lots"]}, None, "weight_block_size"),
        ("ignored layers int", {"generator.inference_engine.engine_init_kwargs.hf_overrides.quantization_config."
                                "ignored_layers": 5}, None, "ignored_layers"),
        ("exclude string", {"fp8check.exclude": "mlp.gate"}, None, "fp8check.exclude"),
        ("epsilon string", {"fp8check.amax_epsilon": "tiny"}, None, "fp8check.amax_epsilon"),
        ("epsilon negative", {"fp8check.amax_epsilon": -1.0}, None, "fp8check.amax_epsilon"),
        ("recipe typo", {"trainer.policy.megatron_config.fp8_recipe": "blokwise"}, None, "fp8_recipe"),
        ("recipe typo in a full job", None, ["--set", "trainer.policy.megatron_config.transformer_config_kwargs."
                                             "fp8_recipe=blockwize"], "did you mean 'blockwise'?"),
        ("fp8 format typo", {"trainer.policy.megatron_config.fp8": "e4m4"}, None, "megatron_config.fp8"),
        ("sync mode typo", {"generator.inference_engine.fp8_weight_sync_mode": "blockwize"}, None,
         "fp8_weight_sync_mode"),
        ("sync mode typo in a full job", None, ["--set", "generator.inference_engine.fp8_weight_sync_mode=blokwise"],
         "did you mean 'blockwise'?"),
        ("lora rank string", {"trainer.policy.model.lora.rank": "16"}, None, "lora.rank"),
        ("mtp switch string", {"trainer.mtp.enabled": "yes"}, None, "trainer.mtp.enabled"),
        ("model path int", {"trainer.policy.model.path": 7}, None, "trainer.policy.model.path"),
        ("top level list", ["a", "b"], None, "top level must be a mapping"),
        ("env empty name", None, ["--env", "=1"], "not a variable name"),
        ("env bad flag", None, ["--env", "VLLM_USE_DEEP_GEMM_E8M0=yes"], "VLLM_USE_DEEP_GEMM_E8M0"),
        ("env epsilon", None, ["--env", "NVTE_FP8_BLOCK_AMAX_EPSILON=small"], "NVTE_FP8_BLOCK_AMAX_EPSILON"),
        ("set without =", None, ["--set", "fp8check.seed"], "--set"),
        ("bad gpu", None, ["--gpu", "sm75x"], "--gpu"),
    ]
    for i in range(20):                       # faker: realistic names in the wrong places
        key = FAKE.random_element(["fp8check.seed", "trainer.policy.megatron_config.context_parallel_size",
                                   "generator.inference_engine.tensor_parallel_size", "fp8check.packing.collate_multiple"])
        out.append((f"faker {i}", {key: FAKE.word()}, None, key))
    return out


JOB_CASES = _job_cases()


@pytest.mark.parametrize("name,content,extra,needle", JOB_CASES, ids=[c[0] for c in JOB_CASES])
def test_bad_job_config(tmp_path, name, content, extra, needle):
    if content is None:
        path = HOPPER
    else:
        path = str(tmp_path / "job.yaml")
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else yaml.safe_dump(content).encode())
    argv = ["preflight", path, "--gpu", "sm90"] + list(extra or [])
    if extra and "--gpu" in extra:
        argv = ["preflight", path] + list(extra)
    rc, _, err = run(argv)
    assert_clean_failure(rc, err, needle)


MODEL_CONFIGS = [
    ("a list", [1, 2]), ("zero heads", {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 0}),
    ("null hidden", {"hidden_size": None, "num_hidden_layers": 2, "num_attention_heads": 8}),
    ("no layers", {"hidden_size": 1024, "num_attention_heads": 8}),
    ("string heads", {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": "8"}),
    ("heads not dividing", {"hidden_size": 1000, "num_hidden_layers": 2, "num_attention_heads": 7}),
    ("kv not dividing", {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
                         "num_key_value_heads": 3}),
    ("negative experts", {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_experts": -2}),
    ("layer types not a list", {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
                                "layer_types": "full"}),
    ("not json", None),
]


@pytest.mark.parametrize("name,cfg", MODEL_CONFIGS, ids=[c[0] for c in MODEL_CONFIGS])
def test_bad_model_config_json(tmp_path, name, cfg):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{not json" if cfg is None else json.dumps(cfg))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"trainer": {"policy": {"model": {"path": str(d)}}}}))
    rc, _, err = run(["preflight", str(job), "--gpu", "sm90"])
    assert_clean_failure(rc, err, "config.json")


@pytest.mark.parametrize("argv,needle", [
    (["snapshot", "--out", "{file}/sub"], "--out"), (["snapshot", "--out", "{file}"], "--out"),
    (["snapshot", "--out", "/proc/fp8check-no"], "--out"), (["snapshot", "--seed", "-1", "--out", "{dir}/x"], "--seed"),
    (["snapshot", "--steps", "-1", "--out", "{dir}/x"], "--steps"), (["snapshot", "--steps", "zero", "--out", "x"], "--steps"),
    (["faults", "--workers", "-1"], "--workers"), (["faults", "--workers", "0"], "--workers"),
    (["faults", "--junit", "{dir}/missing/j.xml", "--fault", "scale_x2_block", "--model", "tiny-dense"], "--junit"),
    (["verify", "{dir}", "--junit", "{dir}/missing/j.xml"], "--junit"), (["verify", "{dir}/nope"], "nope"),
    (["faults", "--model", "tiny-huge"], "tiny-huge"), (["faults", "--fault", "no_such_fault"], "no_such_fault"),
    (["faults", "--recipe", "fp4"], "fp4"), (["snapshot", "--recipe", "fp4", "--out", "x"], "fp4"),
    (["faults", "--fault", "scale_droped"], "did you mean 'scale_dropped'?"),
    (["faults", "--recipe", "blockwize-fp32"], "did you mean 'blockwise-fp32'?"),
    (["snapshot", "--engine", "vllm", "--out", "{dir}/y"], "--engine"), (["catalog", "--bogus"], "--bogus"),
    (["nonsense"], "nonsense"), (["live", "--steps", "-2"], "--steps"),
    (["snapshot", "--set", "rollout.quantization=bogus", "--out", "{dir}/z"], "rollout.quantization: 'bogus'"),
    (["snapshot", "--set", "rollout.kv_scale=1e999", "--out", "{dir}/z"], "rollout.kv_scale must be a number, got '1e999'"),
    (["snapshot", "--set", "rollout.kv_scale=0", "--out", "{dir}/z"], "rollout.kv_scale must be finite and > 0"),
    (["snapshot", "--set", "rollout.weight_block_size=[128, x]", "--out", "{dir}/z"],
     "rollout.weight_block_size[1] must be an integer, got 'x'"),
    (["snapshot", "--set", "rollout.tp_size=two", "--out", "{dir}/z"], "rollout.tp_size must be an integer, got 'two'"),
    (["snapshot", "--set", "rollout.quantisation=checkpoint", "--out", "{dir}/z"], "did you mean 'quantization'?"),
    (["snapshot", "--set", "trainer.precision=fp16", "--out", "{dir}/z"], "trainer.precision: 'fp16' is not one of"),
    (["snapshot", "--recipe", "blockwise-pow2", "--set", "rollout.quantization=online-per-block", "--out", "{dir}/z"],
     "online-per-block quantizes 128x128 blocks with FP32 scales"),
    (["snapshot", "--recipe", "mxfp8", "--set", "rollout.quantization=nemo-rl-blockwise", "--out", "{dir}/z"],
     "nemo-rl-blockwise quantizes 128x128 blocks"),
    (["snapshot", "--set", "trainer.precision=fp8-delayed", "--out", "{dir}/z"],
     "fp8-delayed (per-tensor delayed scaling) has no on-policy checkpoint sync"),
    (["e2e", "--arms", "bf16-block-rollout", "--recipe", "blockwise-pow2", "--out", "{dir}/e"],
     "--arms bf16-block-rollout with --recipe blockwise-pow2"),
    (["e2e", "--merge", "{dir}/no_part", "--out", "{dir}/m"], "no runs.jsonl"),
    (["e2e", "--seed-start", "-1", "--out", "{dir}/e"], "--seed-start -1: must be >= 0"),
])
def test_bad_command_lines(tmp_path, argv, needle):
    f = tmp_path / "afile"
    f.write_text("x")
    argv = [a.format(file=str(f), dir=str(tmp_path)) for a in argv]
    rc, _, err = run(argv)
    assert_clean_failure(rc, err, needle)


@pytest.mark.parametrize("argv", [["e2e", "--engine", "live", "--steps", "2"], ["live", "--model", "tiny-dense"]])
@pytest.mark.parametrize("missing", ["ray", "vllm"])
def test_a_gpu_machine_without_the_gpu_extras_is_one_line(tmp_path, monkeypatch, argv, missing):
    """A CUDA machine missing Ray or vLLM (met on the H200 when its environment was not loaded: `fp8check e2e
    --engine live` said "internal error: ModuleNotFoundError: No module named 'ray'")."""
    import builtins
    import torch
    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.split(".")[0] == missing:
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        return real_import(name, *a, **k)
    import sys
    import types
    for present in {"ray", "vllm"} - {missing}:      # this CPU machine has neither: the other one stands in
        monkeypatch.setitem(sys.modules, present, sys.modules.get(present) or types.ModuleType(present))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    rc, _, err = run(argv + ["--out", str(tmp_path / "o")])
    assert_clean_failure(rc, err, f"{missing} is not installed", "pip install '.[gpu]'")


def test_piping_into_head_exits_quietly():
    import subprocess
    import sys
    for cmd in (["catalog", "--json"], ["catalog"], ["preflight", HOPPER, "--gpu", "sm90", "--json", "-v"]):
        p = subprocess.run(f"{sys.executable} -m fp8check {' '.join(cmd)} | head -c 10", shell=True, capture_output=True,
                           text=True)
        assert "internal error" not in p.stderr and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_corpus_size():
    n = len(MANIFEST_CASES) + 8 + 2 + 5 + 1 + 20 + len(JOB_CASES) + len(MODEL_CONFIGS) + 19 + 4
    assert n >= 200, n
