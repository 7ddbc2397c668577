"""Hypothesis strategies for fuzzing your own FP8 sync code (`pip install 'fp8check[strategies]'`):

    from hypothesis import given
    from fp8check import strategies as fst

    @given(fst.weights(), fst.recipes())
    def test_my_sender_keeps_trainer_bytes(w, recipe): ...

`shapes`, `weights` (wide dynamic range, zero / NaN / inf / subnormal blocks), `recipes`, `model_specs`,
`sync_configs`, `fault_params`. Without Hypothesis, importing this module raises one ImportError naming the extra.
"""
from fp8check.harness.strategies import (  # noqa: F401
    __all__, fault_params, model_specs, recipes, shapes, sync_configs, weights)
