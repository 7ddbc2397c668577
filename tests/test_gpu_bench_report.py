"""The GPU bench's report (bench/gpu_bench.py: run on the H200 only) on synthetic rows: a report that crashed there
would cost a device call. The added wall is the mode's best sync against the sync alone's best."""
import pytest

from bench import gpu_bench


def _row(wall, deferred, catalog=True):
    r = {"wall": wall, "export": 0.07, "wire": 0.025, "install": 0.1, "fired": [], "unknown": [], "fetched": 0,
         "params": 147, "deferred": deferred, "payload_bytes": 4_000_000_000}
    if catalog:
        r.update({"poison": 0.001, "capture": 0.02, "capture.engine_digests": 0.01, "checks": 0.015,
                  "check.S3": 0.005, "check_extra_peak_bytes": 1 << 24})
    return r


def test_the_report_sets_each_mode_beside_the_sync_alone(capsys):
    per = ["S7:idempotence", "C1", "P1"]
    rows = {"full": [_row(0.6, []) for _ in range(3)], "bare": [_row(0.21, [], False), _row(0.2, [], False)],
            # the schedule's first sync is periodic: a per-sync mode is judged on its per-sync syncs
            "per_sync": [_row(0.6, []), _row(0.26, per), _row(0.25, per)]}
    res = {}
    gpu_bench.report_sync("m", rows, 2000.0, res)
    assert res["per_sync"]["wall_added_seconds"] == pytest.approx(0.05)
    assert res["per_sync"]["wall_added_fraction_of_sync"] == pytest.approx(0.05 / 0.17)
    assert res["per_sync"]["catalog_fraction_of_sync"] == pytest.approx(0.036 / 0.17)
    assert res["full"]["wall_added_seconds"] == pytest.approx(0.4)
    out = capsys.readouterr().out
    assert "(the sync alone): wall 0.200 s" in out and "the catalog adds 50.0 ms" in out
    # every per-sync sync's share is printed (the target is each sync's), not the best one's alone
    assert res["per_sync"]["catalog_fractions"] == pytest.approx([0.036 / 0.17] * 2)
    assert "each sync: 21.2% (checks 15.0 ms" in out
    rows["per_sync"] += [_row(0.35, per), _row(0.27, per)]        # medians, not the best: 0.27 - 0.2
    gpu_bench.report_sync("m", rows, None, res)
    assert res["per_sync"]["wall_added_seconds"] == pytest.approx(0.07)


def test_a_launch_shape_sweep_measures_each_count_and_puts_the_default_back():
    import types
    mod = types.SimpleNamespace(BLOCKS_PER_PROGRAM=8)
    default, sweep = gpu_bench._sweep_blocks(mod, (1, 4), lambda: mod.BLOCKS_PER_PROGRAM * 10)
    assert (default, sweep, mod.BLOCKS_PER_PROGRAM) == (8, {1: 10, 4: 40}, 8)

    def broken():
        raise RuntimeError("kernel failed")
    with pytest.raises(RuntimeError):
        gpu_bench._sweep_blocks(mod, (2,), broken)
    assert mod.BLOCKS_PER_PROGRAM == 8
