"""On-disk snapshot directory: master / trainer / payload / rollout safetensors + manifest.json.

Reading never trusts the files: a missing, truncated or corrupt file, a manifest that does not parse or does not
follow its schema (the `Manifest` dataclass tree, validated once here), raises SnapshotError with one line naming
the file and key and what to do; checks never see malformed metadata.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..record import EngineRecord, PayloadMeta, TrainerRecord
from ..schema import SchemaError, from_data
from .model import Snapshot

FORMAT = "fp8check-snapshot"
FORMAT_VERSION = 2          # 2: typed records (harness.record), algorithm-tagged digests, the model's spec
FILES = {"master": "master.safetensors", "trainer": "trainer.safetensors", "payload": "payload.safetensors",
         "rollout": "rollout.safetensors"}
MANIFEST = "manifest.json"


class SnapshotError(ValueError):
    """The snapshot directory cannot be read or written."""


@dataclass
class Exclusion:
    high_precision: list[str] = field(default_factory=list)
    fp8: list[str] = field(default_factory=list)
    ignored_layers: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    """manifest.json, as the schema every reader validates."""
    format: str
    format_version: int
    model: str
    recipe: str
    sync: str
    config: dict[str, Any]
    trainer: TrainerRecord
    rollout: EngineRecord
    payload: PayloadMeta
    step: int | None = None
    seed: int = 0
    model_spec: dict[str, Any] | None = None
    exclusion: Exclusion = field(default_factory=Exclusion)
    layout: dict[str, Any] = field(default_factory=dict)
    digests: dict[str, dict[str, str]] = field(default_factory=dict)


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
            except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
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
    manifest: Manifest
    raw: dict
    master: Snapshot
    trainer: Snapshot
    payload: Snapshot
    rollout: Snapshot


def snapshot_manifest(config, step: int | None, **snaps: Snapshot) -> dict:
    """What a snapshot directory records beside its tensors: the config that drove the sync (so `verify` runs
    the same checks elsewhere) and the model's spec, the exclusion set and layout map it implies, each role's
    typed record and the digest of every tensor (edits after capture are reported)."""
    from ..sync.payload import tensor_digest
    return {
        "model": config.model, "recipe": config.recipe.name, "sync": config.sync_mode, "step": step,
        "seed": config.seed, "config": config.to_dict(), "model_spec": config.spec.to_dict(),
        "exclusion": {"high_precision": sorted(config.high_precision), "fp8": sorted(config.fp8_tensors),
                      "ignored_layers": list(config.ignored_layers)},
        "layout": config.layout.to_json(),
        **{role: s.meta.to_json() for role, s in snaps.items() if role != "master"},
        "digests": {role: {n: tensor_digest(t) for n, t in s.tensors.items()} for role, s in snaps.items()},
    }


def prepare_out_dir(path: str, what: str = "--out") -> str:
    """Check an output directory before anything is computed: creatable, a directory, writable."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise SnapshotError(f"{what} {path}: exists and is not a directory; choose a new directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise SnapshotError(f"{what} {path}: cannot create the directory ({e.strerror or e.__class__.__name__}); "
                            f"choose another path") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SnapshotError(f"{what} {path}: not writable; choose another path")
    return path


def _public(path: str):
    """Snapshot files are meant to be copied and verified elsewhere: same mode as manifest.json (umask-based)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def write_snapshot_dir(path: str, manifest, **snaps: Snapshot) -> None:
    """Write the given roles' tensors and the manifest (a dict from `snapshot_manifest`, or a read Manifest)."""
    if isinstance(manifest, Manifest):
        from ..schema import to_data
        manifest = {k: v for k, v in to_data(manifest).items() if k not in ("format", "format_version")}
    prepare_out_dir(path)
    try:
        for role, fname in FILES.items():
            if role in snaps:
                s = snaps[role]
                fp = os.path.join(path, fname)
                save_file({k: v.detach().contiguous() for k, v in s.tensors.items()}, fp, metadata={"role": role})
                _public(fp)
        with open(os.path.join(path, MANIFEST), "w") as f:
            json.dump({"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}, f, indent=1, default=str)
    except OSError as e:
        raise SnapshotError(f"{path}: cannot write the snapshot ({e.strerror or e.__class__.__name__})") from None


def read_manifest(path: str) -> tuple[Manifest, dict]:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise SnapshotError(f"{mpath}: missing; a snapshot directory needs manifest.json (from `fp8check snapshot`)")
    try:
        with open(mpath, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise SnapshotError(f"{mpath}: not valid JSON ({_short(e)}); re-create the snapshot") from None
    except OSError as e:
        raise SnapshotError(f"{mpath}: cannot be read ({e.strerror or e.__class__.__name__})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SnapshotError(f"{mpath}: not an fp8check snapshot manifest (format != {FORMAT!r})")
    if raw.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{mpath}: format_version {raw.get('format_version')!r} is not supported "
                            f"(this fp8check reads {FORMAT_VERSION}); re-create the snapshot")
    try:
        m = from_data(Manifest, raw, "")
    except SchemaError as e:
        raise SnapshotError(f"{mpath}: {e}; re-create the snapshot with `fp8check snapshot`") from None
    unknown = sorted(set(m.digests) - set(FILES))
    if unknown:
        raise SnapshotError(f"{mpath}: digests.{unknown[0]}: not a snapshot role (expected {', '.join(FILES)})")
    return m, raw


def read_snapshot_dir(path: str) -> SnapshotDir:
    if not os.path.isdir(path):
        raise SnapshotError(f"{path}: no such snapshot directory; create one with `fp8check snapshot --out {path}`")
    manifest, raw = read_manifest(path)
    snaps = {}
    metas = {"master": None, "trainer": manifest.trainer, "payload": manifest.payload, "rollout": manifest.rollout}
    for role, fname in FILES.items():
        fp = os.path.join(path, fname)
        if not os.path.isfile(fp):
            raise SnapshotError(f"{fp}: missing; a snapshot directory needs {', '.join(FILES.values())}")
        snaps[role] = Snapshot(role, LazyTensors(fp).load_all(), metas[role])
    return SnapshotDir(path, manifest, raw, **snaps)
