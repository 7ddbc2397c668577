"""Kinds as types (harness.kinds) and the one config validator (harness.schema): strings become members once, in
the dataclasses; a config is read by the schema the records are; errors stay one line naming the key path."""
import dataclasses
import glob
import json

import pytest
import yaml

from fp8check.harness.config import (ENGINE_QUANTIZATION, TRAINER_PRECISIONS, RolloutConfig, SyncConfig,
                                     TrainerConfig)
from fp8check.harness.errors import BadInput, ConfigError, RecipeError
from fp8check.harness.formats.recipe import GRANULARITIES, SCALE_FORMATS, Recipe, get_recipe
from fp8check.harness.jobconfig import config_from_job
from fp8check.harness.kinds import Granularity, Precision, Quantization, ScaleFormat, Stage, member, values
from fp8check.harness.schema import SchemaError, from_data, to_data
from fp8check.harness.sync.pipeline import STAGES


# -- the enums -------------------------------------------------------------------------------------------------------
def test_members_are_their_strings():
    """A StrEnum member equals, hashes, formats and serialises as its value: configs written as strings and code
    that still compares strings keep working."""
    assert Granularity.MXFP8 == "mxfp8" and hash(Quantization.NONE) == hash("none")
    assert f"{Precision.FP8_DELAYED}" == "fp8-delayed" and str(ScaleFormat.E8M0) == "e8m0"
    assert json.dumps({"q": Quantization.ONLINE_PER_BLOCK}) == '{"q": "online-per-block"}'
    assert {"block": 1}[Granularity.BLOCK] == 1


def test_the_value_tuples_are_derived_from_the_enums():
    assert GRANULARITIES == ("block", "mxfp8", "tensor") == values(Granularity)
    assert SCALE_FORMATS == ("fp32", "pow2", "e8m0") == values(ScaleFormat)
    assert ENGINE_QUANTIZATION == ("checkpoint", "online-per-block", "online-per-tensor", "nemo-rl-blockwise", "none")
    assert TRAINER_PRECISIONS == ("fp8", "fp8-delayed", "bf16")
    assert all(type(v) is str for v in GRANULARITIES + ENGINE_QUANTIZATION)   # messages list plain strings


def test_the_pipeline_stages_are_the_stage_enum():
    """`STAGES = tuple(Stage)` in harness.sync.pipeline is then a no-op for every caller."""
    assert STAGES == tuple(Stage)


def test_member_takes_a_member_or_its_value_and_nothing_else():
    assert member(Quantization, "none") is Quantization.NONE
    assert member(Quantization, Quantization.NONE) is Quantization.NONE
    for bad in ("None", "NONE", None, 0, ["none"], Granularity.BLOCK):
        assert member(Quantization, bad) is None


# -- coercion in the dataclasses ---------------------------------------------------------------------------------------
def test_recipe_coerces_its_kinds():
    r = Recipe("x", granularity="tensor", scale_format="pow2")
    assert r.granularity is Granularity.TENSOR and r.scale_format is ScaleFormat.POW2
    assert get_recipe("mxfp8").granularity is Granularity.MXFP8
    assert dataclasses.replace(r, granularity="block").granularity is Granularity.BLOCK
    assert r == Recipe("x", granularity=Granularity.TENSOR, scale_format=ScaleFormat.POW2)


@pytest.mark.parametrize("kw,msg", [
    ({"granularity": "blocks"}, "granularity must be one of ('block', 'mxfp8', 'tensor'), got 'blocks'"),
    ({"scale_format": "fp16"}, "scale_format must be one of ('fp32', 'pow2', 'e8m0'), got 'fp16'"),
    ({"granularity": ["block"]}, "granularity must be one of"),
])
def test_recipe_refuses_other_kinds(kw, msg):
    with pytest.raises(RecipeError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        Recipe("x", **kw)


def test_config_parts_coerce_their_kinds():
    c = SyncConfig(trainer=TrainerConfig(precision="bf16", scale_format="pow2"),
                   rollout=RolloutConfig(quantization="online-per-tensor"))
    assert c.trainer.precision is Precision.BF16 and c.trainer.scale_format is ScaleFormat.POW2
    assert c.rollout.quantization is Quantization.ONLINE_PER_TENSOR
    assert c.engine_recipe.granularity is Granularity.TENSOR and not c.trainer_fp8
    with pytest.raises(ConfigError, match=r"^rollout.quantization: 'fp8' is not one of \('checkpoint', "):
        RolloutConfig(quantization="fp8")
    with pytest.raises(ConfigError, match=r"^trainer.precision: 'fp16' is not one of"):
        TrainerConfig(precision="fp16")


def test_fault_stage_is_a_stage():
    from fp8check.faults import FAULTS
    from fp8check.faults.base import Fault
    assert all(isinstance(f.stage, Stage) for f in FAULTS.values())
    f = Fault("x", "test", "buckets", ("S1",), "a test fault", apply=lambda c, b: b)
    assert f.stage is Stage.BUCKETS
    with pytest.raises(ValueError, match=r"unknown stage 'bucket' \(one of config, trainer, payload, buckets"):
        Fault("x", "test", "bucket", ("S1",), "a test fault", apply=lambda c, b: b)


# -- the one validator -------------------------------------------------------------------------------------------------
def _refused(data) -> str:
    with pytest.raises(ConfigError) as e:
        SyncConfig.from_dict(data, "job.yaml")
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, BadInput)
    return msg


@pytest.mark.parametrize("value,msg", [
    ([128, "x"], "job.yaml: rollout.weight_block_size[1] must be an integer, got 'x'"),
    ([128], "job.yaml: rollout.weight_block_size must be a list of 2 integers, got 1 item"),
    ([128, 128, 1], "job.yaml: rollout.weight_block_size must be a list of 2 integers, got 3 items"),
    ([128, True], "job.yaml: rollout.weight_block_size[1] must be an integer, got True"),
    ("128x128", "job.yaml: rollout.weight_block_size must be a list of 2 integers, got '128x128'"),
])
def test_weight_block_size_is_two_integers(value, msg):
    """The hand-written validator took any list here (`[128, "x"]` reached the engine's quantization_config)."""
    assert _refused({"rollout.weight_block_size": value}) == msg


def test_weight_block_size_accepted_as_a_tuple():
    c = SyncConfig.from_dict({"rollout": {"weight_block_size": [128, 64]}})
    assert c.rollout.weight_block_size == (128, 64)
    assert SyncConfig.from_dict({"rollout.weight_block_size": None}).rollout.weight_block_size is None


@pytest.mark.parametrize("key,value,allowed", [
    ("rollout.quantization", "fp8_per_block", ENGINE_QUANTIZATION),
    ("trainer.precision", "fp16", TRAINER_PRECISIONS),
    ("trainer.scale_format", "ue8m0", SCALE_FORMATS),
    ("recipe.granularity", "blocks", GRANULARITIES),
])
def test_an_unknown_kind_names_the_key_and_the_allowed_values(key, value, allowed):
    data = {key: value, "recipe.name": "blockwise-fp32"} if key.startswith("recipe.") else {key: value}
    msg = _refused(data)
    assert msg.startswith(f"job.yaml: {key}: '{value}' is not one of"), msg
    assert all(f"'{a}'" in msg for a in allowed), msg


def test_a_kind_of_the_wrong_type_names_the_key():
    assert _refused({"rollout.quantization": 3}).startswith("job.yaml: rollout.quantization: 3 is not one of")


@pytest.mark.parametrize("data,msg", [
    ({"rollout.tp_size": "2"}, "job.yaml: rollout.tp_size must be an integer, got '2'"),
    ({"transport.bucket_bytes": 1.5}, "job.yaml: transport.bucket_bytes must be an integer, got 1.5"),
    ({"transport.verify_digests": "yes"}, "job.yaml: transport.verify_digests must be true or false, got 'yes'"),
    ({"packing.collate_multiple": "8"}, "job.yaml: packing.collate_multiple must be an integer, got '8'"),
    ({"rollout": "fast"}, "job.yaml: rollout must be a mapping (RolloutConfig), got 'fast'"),
    ({"exclude": ["mlp.gate", 3]}, "job.yaml: exclude[1] must be a string, got 3"),
    ({"recipe": {"name": "blockwise-fp32", "block_shape": [128, "a"]}},
     "job.yaml: recipe.block_shape[1] must be an integer, got 'a'"),
    ({"recipe": {"name": "blockwise-fp32", "amax_epsilom": 0.0}}, "job.yaml: recipe: unknown key 'amax_epsilom'"),
    ({"recipe": {"block_shape": [128, 128]}}, "job.yaml: recipe mapping needs a 'name'"),
    ({"rollout.kv_scale": "1e999"}, "job.yaml: rollout.kv_scale must be a number, got '1e999'"),
    ({"rollout.tp_sise": 2}, "job.yaml: rollout: unknown key 'tp_sise'; did you mean 'tp_size'?"),
])
def test_errors_name_the_key_path(data, msg):
    assert _refused(data).startswith(msg)


def test_float_fields_take_integers():
    c = SyncConfig.from_dict({"rollout.kv_scale": 2, "trainer.amax_epsilon": 0,
                              "recipe": {"name": "blockwise-fp32", "amax_epsilon": 1}})
    assert c.rollout.kv_scale == 2.0 and type(c.rollout.kv_scale) is float
    assert type(c.trainer.amax_epsilon) is float and type(c.recipe.amax_epsilon) is float


def test_a_part_rule_is_one_line_with_the_source():
    """What the schema cannot say (a rule across fields) is the dataclasses' own ConfigError, prefixed alike."""
    assert _refused({"rollout.kv_scale": 0}).startswith("job.yaml: rollout.kv_scale must be finite and > 0")
    assert _refused({"recipe": "mxfp8", "rollout.quantization": "online-per-block"}).startswith(
        "job.yaml: rollout.quantization=online-per-block quantizes 128x128 blocks")


# -- round trips -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", [
    {"rollout.quantization": "online-per-tensor", "trainer.precision": "bf16"},
    {"rollout.quantization": "online-per-block", "trainer.precision": "fp8-delayed"},
    {"recipe": "blockwise-pow2", "trainer.scale_format": "fp32", "rollout.weight_block_size": [128, 128]},
    {"recipe": "mxfp8", "gpu_arch": "sm100", "rollout.quantization": "none"},
])
def test_kinds_round_trip_through_plain_data(data):
    c = SyncConfig.from_dict(data)
    d = c.to_dict()
    plain = [d["rollout"]["quantization"], d["trainer"]["precision"], d["recipe"]["granularity"],
             d["recipe"]["scale_format"]]
    assert all(type(v) is str for v in plain), plain      # no fp8check types in plain data
    assert SyncConfig.from_dict(d) == c
    assert SyncConfig.from_dict(json.loads(json.dumps(d))) == c
    again = SyncConfig.from_dict(yaml.safe_load(yaml.safe_dump(d)))     # safe_dump refuses a str subclass
    assert again == c and again.rollout.quantization is c.rollout.quantization


def test_config_files_load(tmp_path):
    """A config file in YAML or JSON, through the command line's reader, gives the same config."""
    from fp8check.harness.cli.args import build_config

    class Args:
        config = None
    want = {"model": "tiny-moe", "recipe": {"name": "blockwise-fp32"}, "rollout": {"quantization": "online-per-block",
            "weight_block_size": [128, 128]}, "trainer": {"precision": "bf16"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(want))
    (tmp_path / "c.json").write_text(json.dumps(want))
    got = []
    for name in ("c.yaml", "c.json"):
        a = Args()
        a.config = str(tmp_path / name)
        got.append(build_config(a))
    assert got[0] == got[1] == SyncConfig.from_dict(want)
    assert got[0].rollout.quantization is Quantization.ONLINE_PER_BLOCK


@pytest.mark.parametrize("path", sorted(glob.glob("examples/*.yaml")))
def test_example_jobs_still_load(path):
    c = config_from_job(path, env={}, gpu="sm100" if "blackwell" in path else "sm90")
    assert isinstance(c.rollout.quantization, Quantization) and isinstance(c.trainer.precision, Precision)
    assert isinstance(c.recipe.granularity, Granularity)
    assert SyncConfig.from_dict(c.to_dict()) == c


# -- the schema language ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Rec:
    stage: Stage
    grid: tuple[int, int] = (1, 1)
    dims: tuple[int, ...] = ()
    scale: float = 1.0
    fmt: ScaleFormat | None = None


def test_schema_reads_kinds_and_fixed_tuples():
    r = from_data(_Rec, {"stage": "engine", "grid": [2, 3], "dims": [1, 2, 3], "scale": 2, "fmt": "pow2"}, "rec")
    assert r == _Rec(Stage.ENGINE, (2, 3), (1, 2, 3), 2.0, ScaleFormat.POW2) and r.stage is Stage.ENGINE
    assert to_data(r) == {"stage": "engine", "grid": [2, 3], "dims": [1, 2, 3], "scale": 2.0, "fmt": "pow2"}
    assert type(to_data(r)["stage"]) is str
    for data, msg in [({"stage": "engin"}, "rec.stage: 'engin' is not one of ('config', 'trainer'"),
                      ({"stage": "engine", "grid": [2]}, "rec.grid must be a list of 2 integers, got 1 item"),
                      ({"stage": "engine", "grid": [2, 2.5]}, "rec.grid[1] must be an integer, got 2.5"),
                      ({"stage": "engine", "fmt": "fp16"}, "rec.fmt: 'fp16' is not one of ('fp32', 'pow2', 'e8m0')"),
                      ({"stage": "engine", "dims": "12"}, "rec.dims must be a list of integers, got '12'")]:
        with pytest.raises(SchemaError) as e:
            from_data(_Rec, data, "rec")
        assert str(e.value).startswith(msg), str(e.value)
