"""Triton kernels in the CPU suite: compiled on CUDA tensors where a GPU is present, otherwise in Triton's
interpreter on CPU tensors.  TRITON_INTERPRET=1 must be set before `triton` is first imported (the standard
library's own @triton.jit functions are built at import), so tests/conftest.py sets it on machines without CUDA;
`load` returns (kernel module, device for the test tensors) or skips with the reason -- except where
FP8CHECK_REQUIRE_TRITON=1 (.ci/run sets it: Triton is in `.[dev]`), where a missing Triton fails the test."""
import importlib
import os

import pytest
import torch


def load(module_name: str):
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("FP8CHECK_REQUIRE_TRITON") == "1":
        import triton  # noqa: F401  (CI: an ImportError here fails the test instead of skipping it)
    pytest.importorskip("triton", reason="triton is not installed (pip install triton): kernel not tested here")
    if torch.cuda.is_available():
        return importlib.import_module(module_name), "cuda"
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(std.zeros, InterpretedFunction):
        pytest.skip("triton was imported in compiled mode (TRITON_INTERPRET unset at its first import)",
                    allow_module_level=True)
    mod = importlib.import_module(module_name)
    kernels = [v for v in vars(mod).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    if any(not isinstance(k, InterpretedFunction) for k in kernels):     # imported earlier in compiled mode
        mod = importlib.reload(mod)
    return mod, "cpu"
