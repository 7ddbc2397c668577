"""Load SkyRL 0.4.0's own FP8 weight-sync modules from its downloaded wheel, without installing it.

SkyRL 0.4.0 requires Python >= 3.12 to install (and pins vllm 0.30, torch 2.13, transformer-engine 2.16, ray 2.57),
yet its FP8 sync code needs only torch. So, as `examples/verl_fp8_rollout/verl_loader.py` does for verl, this
module registers *empty* package modules for `skyrl` and the sub-packages on the way (each with its directory
inside the wheel as its `__path__`: Python's zip importer then reads the real files straight from the .whl), puts
shims in sys.modules for what those files import that a CPU box lacks (below), and imports SkyRL's real modules:

    skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py        blockwise_cast_to_fp8, mx_cast_to_fp8 (+ batched)
    skyrl/backends/skyrl_train/weight_sync/fp8/vllm_format.py     SerializedFp8Config, iter_serialized_fp8_tensors,
                                                                  scale_name_for_weight, the wire-format table
    skyrl/backends/skyrl_train/weight_sync/fp8/models/base.py     ModelFp8Spec, batched_moe_wire_targets
    skyrl/backends/skyrl_train/weight_sync/fp8/models/qwen35.py   the Qwen3.5 spec (SkyRL's one registered spec)
    skyrl/backends/skyrl_train/weight_sync/sources.py             SerializedFp8WeightSource (the Megatron worker's
                                                                  sender: workers/megatron/megatron_worker.py:1396)

Nothing of SkyRL's code is copied here, and every file loaded is checked against the sha256 the wheel's own RECORD
lists for it. The shims, only where the real package is absent (a GPU host with vLLM keeps vLLM's own):

    loguru                                  `logger` only (quantization_utils.py and sources.py import it), on
                                            the standard `logging` module
    vllm.distributed.weight_transfer.base   ParamMeta, WeightSource, materialize_full_tensor: the three names
                                            sources.py imports (vLLM's trainer-side weight-transfer contract; the
                                            same definitions as vLLM 0.26 / 0.30's base.py)

The wheel is found at `$SKYRL_WHEEL` (the .whl file or a directory holding it), else in this example's `wheels/`
directory (git-ignored), where `.ci/run` downloads it:

    pip download --no-deps --python-version 3.12 --only-binary=:all: skyrl==0.4.0 -d examples/skyrl_fp8_sync/wheels
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import logging
import os
import sys
import types
import zipfile

SKYRL_VERSION = "0.4.0"
WHEEL = f"skyrl-{SKYRL_VERSION}-py3-none-any.whl"
HERE = os.path.dirname(os.path.abspath(__file__))
DOWNLOAD = (f"pip download --no-deps --python-version 3.12 --only-binary=:all: skyrl=={SKYRL_VERSION} "
            f"-d {os.path.relpath(os.path.join(HERE, 'wheels'))}")
FP8 = "skyrl.backends.skyrl_train.weight_sync.fp8"

# Packages whose __init__.py must not run: skyrl/backends/__init__.py imports the Tinker backend (jax and more);
# the others are on the way (weight_sync/__init__.py is plain, but nothing here needs it). fp8/ and fp8/models/
# are not here: their __init__.py is SkyRL's public FP8 API (and registers the Qwen3.5 spec) and runs as shipped.
_EMPTY_PACKAGES = ("skyrl", "skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.distributed",
                   "skyrl.backends.skyrl_train.distributed.megatron", "skyrl.backends.skyrl_train.weight_sync")
_MODULES = {"fp8": FP8, "quantize": f"{FP8}.quantize", "vllm_format": f"{FP8}.vllm_format",
            "models": f"{FP8}.models", "qwen35": f"{FP8}.models.qwen35",
            "quantization_utils": "skyrl.backends.skyrl_train.distributed.megatron.quantization_utils",
            "sources": "skyrl.backends.skyrl_train.weight_sync.sources"}
_VLLM_BASE = "vllm.distributed.weight_transfer.base"


class SkyRLUnavailable(ImportError):
    """SkyRL 0.4.0's wheel is not where the loader looks (or is not that wheel)."""


def wheel_path() -> str | None:
    """The wheel file, or None when it is not found."""
    where = os.environ.get("SKYRL_WHEEL") or os.path.join(HERE, "wheels")
    path = os.path.join(where, WHEEL) if os.path.isdir(where) else where
    return path if os.path.isfile(path) else None


def why_not() -> str | None:
    """One line saying why SkyRL's modules cannot be loaded here, or None when they can."""
    path = wheel_path()
    if path is None:
        where = os.environ.get("SKYRL_WHEEL") or os.path.relpath(os.path.join(HERE, "wheels"))
        return f"SkyRL {SKYRL_VERSION}'s wheel ({WHEEL}) is not in {where}: {DOWNLOAD} (or set SKYRL_WHEEL)"
    try:
        with zipfile.ZipFile(path) as z:
            meta = z.read(f"skyrl-{SKYRL_VERSION}.dist-info/METADATA").decode()
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        return f"{path} is not SkyRL {SKYRL_VERSION}'s wheel ({e.__class__.__name__}: {e}): {DOWNLOAD}"
    version = next((ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Version:")), None)
    if version != SKYRL_VERSION:
        return f"{path} holds skyrl {version}, this example is written against SkyRL {SKYRL_VERSION}: {DOWNLOAD}"
    return None


def _logger_shim() -> types.ModuleType:
    mod = types.ModuleType("loguru", "shim: loguru's `logger` on the standard logging module (see skyrl_loader)")
    mod.logger = logging.getLogger("skyrl")
    return mod


def _vllm_base_shim() -> types.ModuleType:
    """vLLM's trainer-side weight-transfer contract, the three names SkyRL's sources.py imports."""
    from abc import ABC, abstractmethod
    from dataclasses import dataclass

    import torch

    mod = types.ModuleType(_VLLM_BASE, "shim: ParamMeta, WeightSource, materialize_full_tensor (see skyrl_loader)")

    def materialize_full_tensor(tensor: torch.Tensor) -> torch.Tensor:
        full_tensor = getattr(tensor, "full_tensor", None)          # an FSDP DTensor gathers; a tensor is itself
        return full_tensor() if callable(full_tensor) else tensor

    @dataclass(frozen=True)
    class ParamMeta:
        name: str
        dtype: torch.dtype
        shape: tuple

    class WeightSource(ABC):
        @abstractmethod
        def metadata(self) -> list: ...

        @abstractmethod
        def __iter__(self): ...

    for obj in (ParamMeta, WeightSource):
        obj.__module__ = _VLLM_BASE
    mod.materialize_full_tensor, mod.ParamMeta, mod.WeightSource = materialize_full_tensor, ParamMeta, WeightSource
    return mod


def _verify(z: zipfile.ZipFile, module) -> None:
    """The module's file is byte for byte the one the wheel's RECORD lists (sha256)."""
    inner = module.__file__.split(WHEEL + os.sep, 1)[-1].replace(os.sep, "/")
    record = z.read(f"skyrl-{SKYRL_VERSION}.dist-info/RECORD").decode().splitlines()
    want = next((ln.split(",")[1] for ln in record if ln.startswith(inner + ",")), None)
    got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(z.read(inner)).digest()).rstrip(b"=").decode()
    if want != got:
        raise SkyRLUnavailable(f"{module.__name__}: {inner} does not match the wheel's RECORD ({want} != {got})")


@functools.lru_cache(maxsize=None)
def load() -> types.SimpleNamespace:
    """SkyRL's FP8 sync modules, imported from the wheel: fp8 (the package), quantize, vllm_format, models, qwen35,
    quantization_utils, sources. Raises SkyRLUnavailable (an ImportError) with the download command when the wheel
    is missing."""
    why = why_not()
    if why:
        raise SkyRLUnavailable(why)
    path = wheel_path()
    if "skyrl" not in sys.modules:                 # a process that imported a real skyrl keeps it
        for name in _EMPTY_PACKAGES:
            pkg = types.ModuleType(name, f"empty stand-in for {name}: its __init__.py is not run (see skyrl_loader)")
            pkg.__path__ = [os.path.join(path, *name.split("."))]
            pkg.__package__ = name
            sys.modules[name] = pkg
        sys.modules["skyrl"].__version__ = SKYRL_VERSION
    if importlib.util.find_spec("loguru") is None and "loguru" not in sys.modules:
        sys.modules["loguru"] = _logger_shim()
    if _VLLM_BASE not in sys.modules and importlib.util.find_spec("vllm") is None:
        for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
            pkg = types.ModuleType(name, f"empty stand-in for {name} (vLLM is not installed; see skyrl_loader)")
            pkg.__path__ = []
            sys.modules[name] = pkg
        sys.modules[_VLLM_BASE] = _vllm_base_shim()
    mods = {k: importlib.import_module(v) for k, v in _MODULES.items()}
    with zipfile.ZipFile(path) as z:               # really SkyRL's files, not something else on sys.path
        for k, m in mods.items():
            if not os.path.realpath(m.__file__).startswith(os.path.realpath(path) + os.sep):
                raise SkyRLUnavailable(f"{_MODULES[k]} was loaded from {m.__file__}, not from {path}")
            _verify(z, m)
    return types.SimpleNamespace(**mods)


def shims() -> list[str]:
    """The modules standing in for absent ones in this process (empty when the real packages are installed)."""
    return [n for n in ("loguru", _VLLM_BASE) if "shim" in (getattr(sys.modules.get(n), "__doc__", "") or "")]
