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
