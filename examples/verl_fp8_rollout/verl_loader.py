"""Load verl 0.9.1's own FP8 rollout modules from the installed `verl` package, without running `verl/__init__.py`.

`import verl` needs ray and tensordict (verl/__init__.py imports verl.protocol), which a laptop or a CPU CI box does
not have, yet the FP8 rollout code itself only needs torch. So this module registers *empty* package modules for
`verl` and the sub-packages on the way (each with the installed directory as its `__path__`, so Python's import
system finds the real files), puts one shim in sys.modules (below), and then imports verl's real modules from the
installed files:

    verl/utils/kernel/fp8_kernel.py                scaled_fp8_blockwise (Triton kernel or PyTorch fallback)
    verl/utils/fp8_utils.py                        FP8QuantizerHelper (name rules, quant_weights_by_name)
    verl/utils/sglang/sglang_fp8_utils.py          SGLangFP8QuantizerHelper, build_sglang_fp8_quant_config
    verl/workers/rollout/sglang_rollout/utils.py   get_named_tensor_buckets (the rollout's weight buckets)

Nothing of verl's code is copied here. The one shim: `verl.workers.rollout.utils` (verl's module imports ray,
fastapi and uvicorn for its HTTP server helpers) is replaced by a module holding only `ensure_async_iterator`,
the one name the modules above take from it: an adaptor from a sync or async iterable to an async iterator,
written here (verl's own does the same: `async for` over an async iterable, else `for`).

Kernel path: verl reads `VERL_DISABLE_TRITON_FP8` once, when fp8_kernel.py is imported. Without a CUDA device
Triton cannot launch, so the loader sets it to 1 there (unless the caller set it) and verl's PyTorch fallback
runs -- what verl itself does on a machine without Triton. On a GPU machine it is left alone: the Triton kernel is
what verl runs there. `kernel_path()` says which one is in use.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types

VERL_VERSION = "0.9.1"
INSTALL = f"pip install --no-deps verl=={VERL_VERSION}"

# Packages whose __init__.py must not run (verl/__init__.py imports ray; the others are on the way to it).
# verl.plugin and verl.plugin.platform are not here: verl.utils.device imports verl.plugin.platform, whose
# __init__ is plain Python (the platform registry) and runs as verl ships it.
_EMPTY_PACKAGES = ("verl", "verl.utils", "verl.utils.kernel", "verl.utils.sglang", "verl.workers",
                   "verl.workers.rollout", "verl.workers.rollout.sglang_rollout")
_SHIM = "verl.workers.rollout.utils"
_MODULES = {"fp8_kernel": "verl.utils.kernel.fp8_kernel", "fp8_utils": "verl.utils.fp8_utils",
            "sglang_fp8_utils": "verl.utils.sglang.sglang_fp8_utils",
            "sglang_utils": "verl.workers.rollout.sglang_rollout.utils"}


class VerlUnavailable(ImportError):
    """verl 0.9.1 is not installed (or not at that version)."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def why_not() -> str | None:
    """One line saying why verl's modules cannot be loaded here, or None when they can."""
    v = installed_version()
    if v is None:
        return f"verl is not installed: {INSTALL}"
    if v != VERL_VERSION:
        return f"verl {v} is installed, this example is written against verl {VERL_VERSION}: {INSTALL}"
    return None


async def ensure_async_iterator(iterable):
    """Shim for verl.workers.rollout.utils.ensure_async_iterator: yield the items of a sync or async iterable."""
    if hasattr(iterable, "__aiter__"):
        async for item in iterable:
            yield item
    else:
        for item in iterable:
            yield item


@functools.lru_cache(maxsize=None)
def _package_dir() -> str:
    # find_spec on a top-level name locates the package without executing its __init__.py
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise VerlUnavailable(f"verl is not installed: {INSTALL}")
    return list(spec.submodule_search_locations)[0]


@functools.lru_cache(maxsize=None)
def load() -> types.SimpleNamespace:
    """verl's FP8 rollout modules, imported from the installed package: fp8_kernel, fp8_utils, sglang_fp8_utils,
    sglang_utils. Raises VerlUnavailable (an ImportError) with the install command when verl 0.9.1 is missing."""
    why = why_not()
    if why:
        raise VerlUnavailable(why)
    root = _package_dir()                          # before any stand-in is registered
    if "verl" not in sys.modules:                 # a process that imported the real verl keeps it
        for name in _EMPTY_PACKAGES:
            pkg = types.ModuleType(name, f"empty stand-in for {name}: its __init__.py is not run (see verl_loader)")
            pkg.__path__ = [os.path.join(root, *name.split(".")[1:])]
            pkg.__package__ = name
            sys.modules[name] = pkg
        shim = types.ModuleType(_SHIM, "shim: only ensure_async_iterator (verl's module imports ray)")
        shim.ensure_async_iterator = ensure_async_iterator
        sys.modules[_SHIM] = shim
    if "verl.utils.kernel.fp8_kernel" not in sys.modules and "VERL_DISABLE_TRITON_FP8" not in os.environ:
        import torch
        if not torch.cuda.is_available():          # Triton cannot launch here: verl's PyTorch fallback runs
            os.environ["VERL_DISABLE_TRITON_FP8"] = "1"
    mods = {k: importlib.import_module(v) for k, v in _MODULES.items()}
    for k, m in mods.items():                      # really the installed files, not something else on sys.path
        if not os.path.realpath(m.__file__).startswith(os.path.realpath(root)):
            raise VerlUnavailable(f"{_MODULES[k]} was loaded from {m.__file__}, not the installed verl")
    return types.SimpleNamespace(**mods)


def kernel_path() -> str:
    """'triton' or 'pytorch': which implementation verl's scaled_fp8_blockwise runs in this process."""
    k = load().fp8_kernel
    return "triton" if k._TRITON_AVAILABLE and not k._DISABLE_TRITON_FP8 else "pytorch"
