"""The command line's shared pieces: config from flags and files, argparse types, output-path checks (a leaf of
the CLI package: its command modules import these from here, never from the package that imports them)."""
from __future__ import annotations

import argparse
import os

import yaml

from ..config import SyncConfig
from ..errors import ConfigError, UsageError
from ..jobconfig.source import load_job_file as load_yaml  # noqa: F401 - the CLI's name for it
from ..models import BUILTIN, SHIPPED, with_layers


# -- config from the command line ---------------------------------------------------------------------------------
def parse_sets(items: list[str] | None, flag: str = "--set") -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise UsageError(f"{flag} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError:
            out[k.strip()] = v
    return out


def build_config(args) -> SyncConfig:
    data: dict = {}
    source = "command line"
    if getattr(args, "config", None):
        data = load_yaml(args.config)
        source = args.config
    for k in ("model", "recipe", "seed"):
        v = getattr(args, k, None)
        if v is not None:
            data[k] = v
    if getattr(args, "sync", None):
        data["sync_mode"] = args.sync
    data.update(parse_sets(getattr(args, "set", None)))
    layers = getattr(args, "layers", None)
    if layers is not None:
        model = data.get("model", "tiny-dense")
        if not isinstance(model, str):
            raise ConfigError(f"{source}: model must be a name or a path, got {model!r}")
        data["model"] = with_layers(model, layers)
    return SyncConfig.from_dict(data, source)


MODEL_HELP = (f"a built-in model ({', '.join(BUILTIN)}), a shipped config of a real model's shapes "
              f"({', '.join(SHIPPED)}), or a path to a Hugging Face config.json / checkpoint directory")
LAYERS_HELP = "keep only the first N layers (every per-layer shape stays real: a 1-layer Qwen3-8B is 1.4 B parameters)"


def count(minimum: int):
    """argparse type: an integer >= minimum."""
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{n} must be >= {minimum}")
        return n
    parse.__name__ = f"integer >= {minimum}"
    return parse


def out_file(path: str | None, what: str) -> str | None:
    """Check an output file's path before anything is computed: its directory exists and is writable, and the
    path is not a directory."""
    if path is None:
        return None
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{what} {path}: is a directory; give a file path")
    if not os.path.isdir(d):
        raise UsageError(f"{what} {path}: directory {d} does not exist")
    if not os.access(d, os.W_OK):
        raise UsageError(f"{what} {path}: directory {d} is not writable")
    return path


def require_gpu_stack(command: str, cpu_hint: str):
    """The live engines' stack is here (a CUDA GPU, Ray for the engine workers, vLLM), else one line naming what is
    missing and what to run instead."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise UsageError(f"{command} needs an NVIDIA GPU with vLLM, Transformer Engine, Megatron-Core and Ray "
                             f"installed (pip install '.[gpu]'); {cpu_hint}")
        import ray  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as e:
        raise UsageError(f"{command} needs the GPU extras ({e.name} is not installed): pip install '.[gpu]'; "
                         f"{cpu_hint}") from None
