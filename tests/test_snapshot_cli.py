"""`fp8check snapshot` / `verify` end to end: exit codes, one-line errors, and faults applied to the snapshot
files by hand (a few lines of torch + safetensors), not by the injectors."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from fp8check.harness.cli import main

MODELS = ["tiny-dense", "tiny-moe", "tiny-hybrid"]
RECIPES = ["blockwise-fp32", "blockwise-pow2", "mxfp8"]


def run(*argv, capsys=None):
    rc = main(list(argv))
    out = capsys.readouterr() if capsys else None
    return rc, out


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("snap") / "dense")
    assert main(["snapshot", "--model", "tiny-dense", "--recipe", "blockwise-fp32", "--out", d]) == 0
    return d


def copy(src, tmp_path):
    d = str(tmp_path / "copy")
    shutil.copytree(src, d)
    return d


def verify_json(d, capsys):
    rc = main(["verify", d, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_onpolicy_snapshot_verifies(tmp_path, capsys, model, recipe):
    d = str(tmp_path / "s")
    assert main(["snapshot", "--model", model, "--recipe", recipe, "--sync", "onpolicy", "--out", d]) == 0
    capsys.readouterr()
    rc, rep = verify_json(d, capsys)
    assert rc == 0, rep["failing"]
    assert set(os.listdir(d)) == {"master.safetensors", "trainer.safetensors", "payload.safetensors",
                                  "rollout.safetensors", "manifest.json"}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("recipe", ["blockwise-fp32", "blockwise-pow2"])
def test_naive_snapshot_is_a_violation(tmp_path, capsys, model, recipe):
    d = str(tmp_path / "s")
    assert main(["snapshot", "--model", model, "--recipe", recipe, "--sync", "naive", "--out", d]) == 0
    capsys.readouterr()
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and {"S2", "S3", "S4"} & set(rep["failing"])


def edit(d, fname, fn):
    p = os.path.join(d, fname)
    t = load_file(p)
    fn(t)
    save_file(t, p)


def test_hand_flipped_code_byte_is_s2(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    name = "model.layers.1.self_attn.qkv_proj.weight"

    def flip(t):
        b = t[name].view(torch.uint8).clone()
        b[700, 7] ^= 0x01
        t[name] = b.view(torch.float8_e4m3fn)
    edit(d, "rollout.safetensors", flip)
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and "S2" in rep["failing"]
    f = next(f for f in rep["findings"] if f["invariant_id"] == "S2")
    assert f["tensor"] == "model.layers.1.self_attn.k_proj.weight"          # row 700 of q|k|v is k's row 188
    assert f["evidence"]["index"] == [188, 7] and f["evidence"]["rollout"]["index"] == [700, 7]


def test_hand_doubled_scale_is_s3(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    edit(d, "rollout.safetensors", lambda t: t["model.layers.0.mlp.down_proj.weight_scale_inv"][1, 2].mul_(2))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and {"S3", "S4"} <= set(rep["failing"])
    assert any("multiplied by 2" in f["message"] for f in rep["findings"] if f["invariant_id"] == "S3")


def test_hand_transposed_square_weight_is_s2_s4(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)

    def tr(t):
        n = "model.layers.0.self_attn.o_proj.weight"
        t[n] = t[n].view(torch.uint8).t().contiguous().view(torch.float8_e4m3fn)
        t[n + "_scale_inv"] = t[n + "_scale_inv"].t().contiguous()
    edit(d, "rollout.safetensors", tr)
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and {"S2", "S4"} <= set(rep["failing"])
    assert any("transposed" in f["message"] for f in rep["findings"] if f["invariant_id"] == "S4")


def test_hand_removed_parameter_is_caught(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    edit(d, "rollout.safetensors", lambda t: t.pop("model.layers.1.mlp.gate_up_proj.weight_scale_inv"))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and {"S3", "S4"} & set(rep["failing"])


def test_hand_edited_ignored_layers_is_s6(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    m = json.load(open(os.path.join(d, "manifest.json")))
    m["rollout"]["ignored_layers"] = ["model.layers.0.self_attn.o_proj"]
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and "S6" in rep["failing"]


def test_hand_edited_version_is_s7(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    m = json.load(open(os.path.join(d, "manifest.json")))
    m["rollout"]["versions"]["model.layers.1.mlp.down_proj.weight"] = [0]
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and "S7" in rep["failing"]


def test_bf16_codes_written_into_payload_are_s5(snap, tmp_path, capsys):
    d = copy(snap, tmp_path)
    m = json.load(open(os.path.join(d, "manifest.json")))
    for r in m["payload"]["records"]:
        if r["name"] == "model.layers.0.mlp.up_proj.weight":
            r["dtype"] = "bfloat16"
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and "S5" in rep["failing"]


def one_line_error(argv):
    """Run the real console entry in a subprocess: exit 2, one line on stderr, no traceback."""
    p = subprocess.run([sys.executable, "-m", "fp8check", *argv], capture_output=True, text=True)
    return p.returncode, p.stderr.strip()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing", "manifest"])
def test_damaged_snapshot_is_bad_input(snap, tmp_path, damage):
    d = copy(snap, tmp_path)
    target = os.path.join(d, "rollout.safetensors")
    if damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(os.path.getsize(target) // 2)
    elif damage == "garbage":
        with open(target, "wb") as f:
            f.write(b"\x00" * 64)
    elif damage == "missing":
        os.remove(target)
    else:
        with open(os.path.join(d, "manifest.json"), "w") as f:
            f.write("{not json")
    rc, err = one_line_error(["verify", d])
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("rollout.safetensors" in err) or ("manifest.json" in err)


def test_unknown_model_and_missing_dir_are_bad_input(tmp_path):
    rc, err = one_line_error(["snapshot", "--model", "tiny-xl", "--out", str(tmp_path / "x")])
    assert rc == 2 and "tiny-xl" in err and "Traceback" not in err
    rc, err = one_line_error(["verify", str(tmp_path / "nope")])
    assert rc == 2 and len(err.splitlines()) == 1 and "no such snapshot directory" in err


def test_verify_junit(snap, tmp_path, capsys):
    j = str(tmp_path / "v.xml")
    assert main(["verify", snap, "--junit", j]) == 0
    assert "<testsuite" in open(j).read()


def test_faults_list_names_every_fault_and_which_run_live(capsys):
    """`fp8check faults --list` is the README's pointer to the fault taxonomy: every registered fault, and the
    live column agrees with what `fp8check live` would inject into running engines of that model."""
    from fp8check import faults
    from fp8check.faults.base import live_faults
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.vllm import VLLMEngine
    assert main(["faults", "--list", "--model", "tiny-moe"]) == 0
    assert "fp8check faults" in capsys.readouterr().out           # the table (its width follows the terminal)
    assert main(["faults", "--list", "--model", "tiny-moe", "--json"]) == 0
    rows = {r["fault"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(faults.FAULTS)
    live = set(live_faults(recommended_config("tiny-moe", "blockwise-fp32"), VLLMEngine.knobs, differential=True))
    assert {n for n, r in rows.items() if r["live"]} == live and live


# -- a snapshot fails closed: tensors changed since capture, a manifest that disagrees with itself or the tensors -----
DOWN = "model.layers.0.mlp.down_proj.weight"


def _manifest(d):
    return json.load(open(os.path.join(d, "manifest.json")))


def _write_manifest(d, m):
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))


def _grid(d, weight):
    """A weight's unpadded 128x128 scale grid, from the trainer file's header (not from fp8check)."""
    from safetensors import safe_open
    with safe_open(os.path.join(d, "trainer.safetensors"), framework="pt") as f:
        n, k = f.get_slice(weight).get_shape()
    return [-(-n // 128), -(-k // 128)]


def test_a_payload_scale_replaced_after_capture_is_judged_by_its_bytes(snap, tmp_path, capsys):
    """The review's case: a 3x3 tensor put in place of a payload weight_scale_inv verified PASS (the manifest's
    digests stood for the wire's bytes). Its bytes are now judged: S3 and S4 fail, and the change is named."""
    d = copy(snap, tmp_path)
    edit(d, "payload.safetensors", lambda t: t.__setitem__(DOWN + "_scale_inv", torch.ones(3, 3)))
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and {"S3", "S4"} <= set(rep["failing"]), rep["failing"]
    s4 = [f for f in rep["findings"] if f["invariant_id"] == "S4" and f["verdict"] == "fail"]
    assert [(f["tensor"], f["message"], f["evidence"]["stage"]) for f in s4] == [
        (DOWN + "_scale_inv", f"manifest says shape {_grid(d, DOWN)}, bytes arrived as [3, 3]", "transport")]
    assert [c for c in rep["changed_since_capture"] if DOWN + "_scale_inv" in c and "payload.safetensors" in c]


def test_a_wire_that_carried_a_wrong_scale_grid_fails_at_stage_wire(snap, tmp_path, capsys):
    """The same 3x3 scale as the sync's own record (file, digests and record resealed): the wire is judged like
    the engine state, S4 at stage wire."""
    from fp8check.harness.sync.payload import tensor_digest
    d = copy(snap, tmp_path)
    bad = torch.ones(3, 3)
    edit(d, "payload.safetensors", lambda t: t.__setitem__(DOWN + "_scale_inv", bad))
    m = _manifest(d)
    m["digests"]["payload"][DOWN + "_scale_inv"] = tensor_digest(bad)
    for r in m["payload"]["records"]:
        if r["name"] == DOWN + "_scale_inv":
            r["shape"], r["digest"] = [3, 3], tensor_digest(bad)
    _write_manifest(d, m)
    rc, rep = verify_json(d, capsys)
    s4 = {(f["tensor"], f["evidence"].get("stage")) for f in rep["findings"] if f["invariant_id"] == "S4"
          and f["verdict"] == "fail"}
    assert rc == 1 and (DOWN + "_scale_inv", "wire") in s4 and rep["changed_since_capture"] == [], rep["failing"]


def test_a_trainer_digest_edited_in_the_manifest_is_a_bad_snapshot(snap, tmp_path):
    d = copy(snap, tmp_path)
    m = _manifest(d)
    m["digests"]["trainer"][DOWN] = "b2:" + "0" * 32
    _write_manifest(d, m)
    rc, err = one_line_error(["verify", d])
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"trainer.safetensors: tensor '{DOWN}' changed since capture" in err and "manifest.json" in err, err


def test_a_manifest_whose_recipe_disagrees_with_its_config_is_a_bad_snapshot(snap, tmp_path):
    d = copy(snap, tmp_path)
    m = _manifest(d)
    assert m["config"]["recipe"]["name"] == "blockwise-fp32"
    m["recipe"] = "blockwise-pow2"
    _write_manifest(d, m)
    rc, err = one_line_error(["verify", d])
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "manifest.json: recipe is 'blockwise-pow2' but config.recipe.name is 'blockwise-fp32'" in err, err


def test_a_trainer_scale_of_the_wrong_shape_is_a_bad_snapshot(snap, tmp_path):
    """The learner's own bytes are the reference every check compares with: a weight_scale_inv off its grid (the
    digest resealed, so nothing changed since capture) is named, not judged."""
    from fp8check.harness.sync.payload import tensor_digest
    d = copy(snap, tmp_path)
    want = _grid(d, DOWN)
    edit(d, "trainer.safetensors", lambda t: t.__setitem__(DOWN + "_scale_inv", torch.ones(3, 3)))
    m = _manifest(d)
    m["digests"]["trainer"][DOWN + "_scale_inv"] = tensor_digest(torch.ones(3, 3))
    _write_manifest(d, m)
    rc, err = one_line_error(["verify", d])
    assert rc == 2 and f"trainer.safetensors: tensor '{DOWN}_scale_inv' has shape [3, 3]" in err, err
    assert f"needs {want}" in err, err


def test_a_payload_record_that_lies_about_the_receive_is_named(snap, tmp_path, capsys):
    """A payload tensor changed and its digest resealed, its record left: the receive report says it arrived
    with the record's digest, which its bytes do not have. Named, and the wire judged by its bytes (S3)."""
    from fp8check.harness.sync.payload import tensor_digest
    d = copy(snap, tmp_path)
    holder = {}

    def double(t):
        t[DOWN + "_scale_inv"] = t[DOWN + "_scale_inv"] * 2
        holder["t"] = t[DOWN + "_scale_inv"]
    edit(d, "payload.safetensors", double)
    m = _manifest(d)
    m["digests"]["payload"][DOWN + "_scale_inv"] = tensor_digest(holder["t"])
    _write_manifest(d, m)
    rc, rep = verify_json(d, capsys)
    assert rc == 1 and "S3" in rep["failing"]
    assert rep["changed_since_capture"] == [
        f"payload.safetensors: tensor '{DOWN}_scale_inv' does not have its record's digest (manifest.json "
        f"payload.records: {next(r['digest'] for r in m['payload']['records'] if r['name'] == DOWN + '_scale_inv')})"
        " while the receive report lists no mismatch for it"]


# -- tables never cut a tensor or fault name, at 80 columns too ------------------------------------------------------
def test_verify_at_80_columns_keeps_every_tensor_name_whole(snap, tmp_path, capsys, monkeypatch):
    """The review's case: at 80 columns the S1 row of a missing down_proj cut the tensor name before down_proj."""
    import re
    monkeypatch.setenv("COLUMNS", "80")
    d = copy(snap, tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    edit(d, "rollout.safetensors", lambda t: t.pop(name))
    assert main(["verify", d]) == 1
    out = capsys.readouterr().out
    s1 = [ln for ln in out.splitlines() if re.match(r"\W*S1\W", ln)]
    assert s1 and all(name in ln for ln in s1), out
    assert set(n.rstrip(".'") for n in re.findall(r"model\.[\w.']+", out)) == {name}, out


def test_faults_list_at_80_columns_keeps_every_fault_name_whole(capsys, monkeypatch):
    """Each fault name as `--fault` takes it, whole on one line (they broke mid-word at 80 columns)."""
    from fp8check import faults
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["faults", "--list"]) == 0
    words = {w for ln in capsys.readouterr().out.splitlines() for w in ln.replace("│", " ").split()}
    assert set(faults.FAULTS) <= words, sorted(set(faults.FAULTS) - words)
