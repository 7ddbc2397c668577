"""bench/gpu_quantize.py's own code on the CPU (the H200 runs it in one shot, so a Python slip must show here):
small CPU tensors under the Triton interpreter, CUDA events and graphs replaced by host timers and a refusal,
Transformer Engine absent (the bytes then checked against the CPU reference).  One line per launch variant, the
bytes of every variant equal, C1's fused check flags exactly the corrupted tensor."""
import json
import time

import pytest
import torch

try:
    from triton_interp import load
except ImportError:
    from tests.triton_interp import load

tb, DEVICE = load("fp8check.harness.formats.triton_blockwise")


class _Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _no_graph(*a, **k):
    raise RuntimeError("no CUDA graphs on the CPU")


@pytest.mark.skipif(DEVICE != "cpu", reason="the real bench runs where CUDA is")
def test_bench_runs_and_prints_one_line_per_variant(tmp_path, monkeypatch, capsys):
    import bench.gpu_quantize as bq
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Stream", _no_graph)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu (interpreter)")
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(s, generator=g) * 0.02).bfloat16() for s in [(256, 128), (128, 256)]]
    special = bq.special_tensor("cpu", 512, 512)
    out = tmp_path / "q.json"
    report = bq.bench_quantizers(str(out), layers=1, reps=2, xs=xs, special=special)
    text = capsys.readouterr().out
    assert json.loads(out.read_text())["default_variant"] == tb.DEFAULT_VARIANT
    for v in tb.VARIANTS:
        lines = [ln for ln in text.splitlines() if ln.startswith(v + " ")]
        assert len(lines) == 1 and "yes (" in lines[0], (v, text)
        assert report["bytes_equal_te"][v]["differ"] == [] and report["bytes_equal_te"][v]["equal"] > 0
    assert f"{tb.DEFAULT_VARIANT} [default]" in text and "te fp32 128x128: unavailable" in text
    assert report["c1_flags_on_correct_bytes"] == [False, False]
    assert report["c1_flags_one_bit_flipped_in_last"] == [False, True]
    assert all("eager_gbps" in r for r in report["results"].values())
