"""The fault-injection matrix as tests: on every tiny model and recipe, every applicable fault is caught by all of
the invariants it declares must fire, and nothing fires that it does not declare (must or may); every clean run
passes every invariant (no false alarm)."""
import pytest

from fp8check import faults
from fp8check.faults.matrix import matrix_cells, run_cell
from fp8check.harness.config import recommended_config

# cells whose fault cannot apply to that model / recipe are not tests at all (the CLI lists them as n/a)
CELLS = [(f, m, r) for f, m, r in matrix_cells() if f is None or faults.FAULTS[f].applies(recommended_config(m, r))]


@pytest.mark.parametrize("fault,model,recipe", CELLS, ids=[f"{f or 'clean'}-{m}-{r}" for f, m, r in CELLS])
def test_cell(fault, model, recipe):
    cell = run_cell(faults.FAULTS[fault] if fault else None, model, recipe)
    if cell.verdict == "n/a":
        pytest.skip(f"{fault} does not apply to {model}/{recipe}: {cell.detail or 'no target'}")
    detail = [(f.invariant_id, f.tensor, f.message[:100]) for f in cell.findings[:5]]
    if fault is None:
        assert cell.verdict == "pass", f"false alarm: fired {cell.fired}, unknown {cell.unknown}: {detail}"
    else:
        assert cell.verdict == "caught", (f"{fault}: must fire {cell.expected}, fired {cell.fired} "
                                          f"{cell.detail}: {detail}")
        assert not cell.undeclared, f"{fault}: {cell.undeclared} fired but are declared neither must nor may"
