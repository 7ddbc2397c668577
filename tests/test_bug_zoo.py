"""docs/bug-zoo.md against the registry: every report's fault exists, applies to a shipped tiny model, is caught
there by every invariant the table says must fire (and the fault declares the same set), and the table's live
column says what `Fault.live_injectable` says for running vLLM engines."""
import os
import re

import pytest

from fp8check import faults
from fp8check.faults.matrix import TINY_MODELS, run_cell
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.vllm import VLLMEngine
from fp8check.harness.formats import RECIPES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = ("NVIDIA-NeMo/RL#3226", "vllm#57163", "vllm#45617", "sglang#27131", "modal-projects/stitch#16", "verl#7918",
           "prime-rl#2442", "vllm#52915", "ISEEKYAN/Megatron-LM#191", "NVIDIA-NeMo/RL#2081", "verl `fp8_utils` (and other stacks)")


def _rows():
    text = open(os.path.join(ROOT, "docs", "bug-zoo.md")).read()
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[2].startswith("`"):
            rows.append({"report": cells[0], "fault": cells[2].strip("`"), "must": tuple(x.strip() for x in
                         cells[3].split(",")), "live": cells[5]})
    return rows


ROWS = _rows()


def test_every_report_of_the_issue_is_a_row():
    assert [r["report"] for r in ROWS] == list(REPORTS)


@pytest.mark.parametrize("row", ROWS, ids=[r["fault"] for r in ROWS])
def test_each_report_is_a_fault_caught_by_what_the_table_says(row):
    f = faults.FAULTS[row["fault"]]
    assert set(f.trips) == set(row["must"]), (f.trips, row["must"])
    cells = [(m, r) for m in TINY_MODELS for r in RECIPES if f.applies(recommended_config(m, r))]
    assert cells, f"{f.name} applies to no shipped model"
    for m, r in cells[:2]:
        c = run_cell(f, m, r)
        assert c.verdict == "caught" and not c.undeclared, (m, r, c.verdict, c.fired, c.detail)
    cfg = recommended_config(*cells[0])
    live = f.live_injectable(cfg, VLLMEngine.knobs)
    assert row["live"].startswith("yes") == live, (row["live"], live)


def test_calibrated_kv_scales_sync_clean_and_survive_a_clean_wake():
    """The declared source works when nothing is broken: the trainer's per-layer scales travel with the sync, the
    engine serves them (R1 pass), and a level-1 sleep / wake keeps them."""
    from dataclasses import replace
    from fp8check.harness.sync.pipeline import reference_sync, run_sync
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(cfg, rollout=replace(cfg.rollout, kv_cache_dtype="fp8_e4m3", kv_scales="calibrated",
                                       sleep_mode=True))
    res, trainer, rollout = reference_sync(cfg, steps=2)
    assert not res.fired and res.unknown == ["R4"], [(f.invariant_id, f.message) for f in res.findings
                                                     if f.verdict != "pass"]   # R4: no wake yet, nothing to check
    assert sorted(cfg.kv_scale_names) == sorted(r.name for r in res.sent.records if r.role == "kv_scale")
    rollout.sleep(1)
    rollout.wake()
    trainer.optimizer_step()
    again = run_sync(cfg, trainer, rollout)
    r1 = [f for f in again.findings if f.invariant_id == "R1"]
    assert [f.verdict for f in r1] == ["pass"], r1
    assert not again.fired and not again.unknown, [(f.invariant_id, f.message) for f in again.findings
                                                   if f.verdict != "pass"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
@pytest.mark.parametrize("when", ["sync", "wake"])
def test_r1_fails_closed_on_a_non_finite_or_non_positive_scale(bad, when):
    from copy import deepcopy
    from dataclasses import replace
    from fp8check.harness.record import KVScale, WakeEvent
    from fp8check.harness.snapshot import Snapshot
    from fp8check.harness.sync.pipeline import reference_sync
    from fp8check.invariants import run_catalog
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    cfg = replace(cfg, rollout=replace(cfg.rollout, kv_cache_dtype="fp8_e4m3"))
    res = reference_sync(cfg, checks=False)[0]
    meta = deepcopy(res.rollout.meta)
    layer = sorted(meta.serving.kv_scales)[0]
    if when == "sync":
        meta.serving.kv_scales[layer] = KVScale(bad, 1.0, 1.0, 1.0)
    else:
        meta.serving.wake = WakeEvent(1, [], syncs_since=1, kv_scales={layer: KVScale(1.0, bad, 1.0, 1.0)})
    ctx = res.context()
    ctx.rollout = Snapshot("rollout", res.rollout.tensors, meta)
    r1 = run_catalog(ctx, ids=["R1"])
    assert [f.verdict for f in r1] == ["fail"], r1
