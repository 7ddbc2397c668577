"""On-disk snapshot directory: master / trainer / payload / rollout safetensors + manifest.json.

Reading never trusts the files: a missing, truncated or corrupt file, or a manifest that does not parse,
raises SnapshotError with one line naming the file and what to do.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .model import Snapshot

FORMAT = "fp8check-snapshot"
FORMAT_VERSION = 1
FILES = {"master": "master.safetensors", "trainer": "trainer.safetensors", "payload": "payload.safetensors",
         "rollout": "rollout.safetensors"}
MANIFEST = "manifest.json"


class SnapshotError(ValueError):
    """The snapshot directory cannot be read."""


class LazyTensors(Mapping):
    """safetensors file as a mapping; tensors are read on access."""

    def __init__(self, path: str):
        self.path = path
        try:
            with safe_open(path, framework="pt") as f:
                self._keys = list(f.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise SnapshotError(f"{path}: not a readable safetensors file ({_short(e)}); re-create it with "
                                f"`fp8check snapshot`") from None
        self._cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, k):
        if k not in self._cache:
            if k not in self._keys:
                raise KeyError(k)
            try:
                with safe_open(self.path, framework="pt") as f:
                    self._cache[k] = f.get_tensor(k)
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:
                raise SnapshotError(f"{self.path}: tensor {k!r} cannot be read ({_short(e)})") from None
        return self._cache[k]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def load_all(self) -> "LazyTensors":
        for k in self._keys:
            self[k]
        return self


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:160] if str(e) else e.__class__.__name__


@dataclass
class SnapshotDir:
    path: str
    manifest: dict
    master: Snapshot
    trainer: Snapshot
    payload: Snapshot
    rollout: Snapshot


def snapshot_manifest(config, step: int | None, **snaps: Snapshot) -> dict:
    """What a snapshot directory records beside its tensors: the config that drove the sync (so `verify` runs
    the same checks elsewhere), the exclusion set and layout map it implies, each role's metadata and the
    digest of every tensor (edits after capture are reported)."""
    from ..sync.payload import tensor_digest
    return {
        "model": config.model, "recipe": config.recipe.name, "sync": config.sync_mode, "step": step,
        "seed": config.seed, "config": config.to_dict(),
        "exclusion": {"high_precision": sorted(config.high_precision), "fp8": sorted(config.fp8_tensors),
                      "ignored_layers": list(config.ignored_layers)},
        "layout": config.layout.to_json(),
        **{role: s.meta for role, s in snaps.items() if role != "master"},
        "digests": {role: {n: tensor_digest(t) for n, t in s.tensors.items()} for role, s in snaps.items()},
    }


def write_snapshot_dir(path: str, manifest: dict, **snaps: Snapshot) -> None:
    os.makedirs(path, exist_ok=True)
    for role, fname in FILES.items():
        if role in snaps:
            s = snaps[role]
            save_file({k: v.detach().contiguous() for k, v in s.tensors.items()}, os.path.join(path, fname),
                      metadata={"role": role})
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump({"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}, f, indent=1, default=str)


def read_snapshot_dir(path: str) -> SnapshotDir:
    if not os.path.isdir(path):
        raise SnapshotError(f"{path}: no such snapshot directory; create one with `fp8check snapshot --out {path}`")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise SnapshotError(f"{mpath}: missing; a snapshot directory needs manifest.json (from `fp8check snapshot`)")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise SnapshotError(f"{mpath}: not valid JSON ({_short(e)}); re-create the snapshot") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SnapshotError(f"{mpath}: not an fp8check snapshot manifest (format != {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{mpath}: format_version {manifest.get('format_version')!r} is not supported "
                            f"(this fp8check reads {FORMAT_VERSION})")
    for key in ("config", "payload", "trainer", "rollout"):
        if key not in manifest:
            raise SnapshotError(f"{mpath}: key {key!r} missing; re-create the snapshot")
    snaps = {}
    for role, fname in FILES.items():
        fp = os.path.join(path, fname)
        if not os.path.isfile(fp):
            raise SnapshotError(f"{fp}: missing; a snapshot directory needs {', '.join(FILES.values())}")
        tensors = LazyTensors(fp).load_all()
        meta = manifest.get(role, {}) if role != "master" else {}
        snaps[role] = Snapshot(role, tensors, meta)
    return SnapshotDir(path, manifest, **snaps)
