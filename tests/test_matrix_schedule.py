"""The matrix's process scheduler: (model, recipe) groups kept on one worker, the tail of a group taken by an idle
worker, results in matrix order and equal to a serial run's."""
from fp8check import faults  # noqa: F401
from fp8check.faults import matrix


def _verdicts(cells):
    return [(c.fault, c.model, c.recipe, c.verdict, c.fired, c.unknown, c.undeclared) for c in cells]


def test_grouped_workers_equal_the_serial_run(monkeypatch):
    names = list(matrix.FAULTS)[:12]
    models, recipes = ["tiny-dense"], ["mxfp8", "blockwise-fp32"]
    serial = matrix.run_matrix(models, recipes, names, workers=1)
    monkeypatch.setattr(matrix, "STEAL_MIN", 4)         # one worker's group is split: the steal path runs too
    seen = []
    grouped = matrix.run_matrix(models, recipes, names, workers=2, progress=lambda d, t: seen.append((d, t)))
    assert _verdicts(grouped) == _verdicts(serial)
    assert seen[-1] == (len(serial), len(serial)) and len(seen) == len(serial)


def test_more_workers_than_cells():
    cells = matrix.run_matrix(["tiny-dense"], ["mxfp8"], list(matrix.FAULTS)[:1], workers=4)
    assert [c.verdict for c in cells][0] == "pass" and len(cells) == 2
