"""Reading a job file the way its stack does, offline: dotted flattening, a `defaults:` inheritance chain of local
files (NeMo RL's nemo_rl/utils/config.py `load_config_with_inheritance`: parents relative to the child's
directory, merged in order, the child wins), and plain `${a.b}` references to other keys of the job. What cannot be
resolved here (a missing parent, a Hydra config-group list, a resolver such as `${mul:...}`) is recorded, never
guessed: the K20 rule names every value fp8check reads that it could not resolve.
"""
from __future__ import annotations

import os
import re

import yaml

from ..config import ConfigError
from ..errors import UsageError

_REF = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def flatten(data, prefix: str = "", source: str = "config") -> dict:
    """Nested mappings -> dotted keys (an empty mapping stays a leaf)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of keys, got {type(data).__name__}")
    out = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise ConfigError(f"{source}: key {k!r} is not a string")
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + ".", source))
        else:
            out[key] = v
    return out


def _read_yaml(path: str) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read this `defaults:` parent ({e.__class__.__name__}); fix the path or "
                          f"write the inherited keys into the job") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def with_defaults(data: dict, base_dir: str | None, source: str, _seen: tuple = ()) -> tuple[dict, dict, list]:
    """(flat keys, origin of every key, unresolved parents [(name, why)]) for `data` and its `defaults:` chain."""
    data = dict(data)
    parents = data.pop("defaults", None)
    flat = flatten(data, source=source)
    origin = {k: f"written in {source}" for k in flat}
    if parents is None:
        return flat, origin, []
    if isinstance(parents, str):
        parents = [parents]
    merged, morigin, unresolved = {}, {}, []
    for p in parents if isinstance(parents, list) else [parents]:
        if not isinstance(p, str) or not p.endswith((".yaml", ".yml")):
            unresolved.append((str(p), "a Hydra config group, not a file: its values are not read"))
            continue
        path = p if os.path.isabs(p) else os.path.join(base_dir or ".", p)
        if not os.path.isfile(path):
            unresolved.append((p, f"no file {path} here: the values it supplies are not read"))
            continue
        real = os.path.realpath(path)
        if real in _seen:
            raise ConfigError(f"{source}: `defaults:` chain loops back to {path}")
        pflat, porigin, punres = with_defaults(_read_yaml(path), os.path.dirname(path), path, _seen + (real,))
        merged.update(pflat)
        morigin.update({k: (o if o.startswith("inherited") else f"inherited from {path}") for k, o in porigin.items()})
        unresolved += punres
    _drop_shadowed(merged, morigin, flat)
    merged.update(flat)
    morigin.update(origin)
    return merged, morigin, unresolved


def _drop_shadowed(merged: dict, origin: dict, child: dict) -> None:
    """A child leaf replaces the parent's subtree under it (and a child subtree a parent leaf), as OmegaConf does."""
    for k in list(merged):
        if any(k.startswith(c + ".") for c in child) or any(c.startswith(k + ".") for c in child):
            merged.pop(k)
            origin.pop(k, None)


def interpolate(flat: dict, origin: dict) -> dict:
    """Resolve `${a.b}` values that name another key of the job, in place; returns {key: why} for the rest."""
    unresolved: dict = {}

    def resolve(key, depth=0):
        v = flat.get(key)
        if not (isinstance(v, str) and "${" in v):
            return True
        m = _REF.match(v.strip())
        if not m:
            unresolved[key] = f"{v!r} uses a resolver or mixes text (not evaluated offline)"
            return False
        ref = m.group(1)
        if ref not in flat or depth > 20:
            unresolved[key] = f"{v!r} names a key the job does not have"
            return False
        if not resolve(ref, depth + 1):
            unresolved[key] = f"{v!r} depends on {ref}, which is unresolved"
            return False
        flat[key] = flat[ref]
        origin[key] = f"{origin.get(key, 'written')} as {v} = {flat[ref]!r} ({origin.get(ref, 'written')})"
        return True

    for k in list(flat):
        resolve(k)
    return unresolved


def load_job_file(path: str) -> dict:
    """A YAML job (or SyncConfig) file as a mapping; a missing, unreadable or non-mapping file is one line naming it."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}); a job config is YAML text") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', None) or e.__class__.__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data
