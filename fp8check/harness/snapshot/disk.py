"""On-disk snapshot directory: master / trainer / payload / rollout safetensors + manifest.json.

Reading never trusts the files: a missing, truncated or corrupt file, a manifest that does not parse or does not
follow its schema (the `Manifest` dataclass tree, validated once here), raises SnapshotError with one line naming
the file and key and what to do; checks never see malformed metadata.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import SnapshotError  # noqa: F401 - raised here, defined with the other input errors
from ..record import EngineRecord, PayloadMeta, TrainerRecord
from ..schema import SchemaError, from_data
from .model import Snapshot

FORMAT = "fp8check-snapshot"
FORMAT_VERSION = 2          # 2: typed records (harness.record), algorithm-tagged digests, the model's spec
FILES = {"master": "master.safetensors", "trainer": "trainer.safetensors", "payload": "payload.safetensors",
         "rollout": "rollout.safetensors"}
MANIFEST = "manifest.json"


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
    """safetensors file as a mapping; a tensor is read when first accessed and kept (`read` does not keep it).
    The file's header is validated when it is opened (safetensors refuses a file its offsets do not cover)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with safe_open(path, framework="pt") as f:
                self._keys = list(f.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise SnapshotError(f"{path}: not a readable safetensors file ({_short(e)}); re-create it with "
                                f"`fp8check snapshot`") from None
        self._cache: dict[str, torch.Tensor] = {}

    def read(self, k) -> torch.Tensor:
        """The tensor, read from the file now (not kept)."""
        if k in self._cache:
            return self._cache[k]
        if k not in self._keys:
            raise KeyError(k)
        try:
            with safe_open(self.path, framework="pt") as f:
                return f.get_tensor(k)
        except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
            raise SnapshotError(f"{self.path}: tensor {k!r} cannot be read ({_short(e)})") from None

    def __getitem__(self, k):
        if k not in self._cache:
            self._cache[k] = self.read(k)
        return self._cache[k]

    def shape(self, k) -> tuple[int, ...]:
        """A tensor's shape from the file's header (nothing is read)."""
        with safe_open(self.path, framework="pt") as f:
            return tuple(f.get_slice(k).get_shape())

    def __contains__(self, k) -> bool:
        return k in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def load_all(self) -> "LazyTensors":
        for k in self._keys:
            self[k]
        return self


# safetensors dtype names (the format's own spelling)
ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
             torch.float8_e5m2: "F8_E5M2", torch.float8_e5m2fnuz: "F8_E5M2FNUZ", torch.float8_e8m0fnu: "F8_E8M0"}


def write_safetensors(path: str, tensors: Mapping, metadata: dict[str, str] | None = None, digest=None) -> dict:
    """Write a safetensors file one tensor at a time (a mapping that makes its values when read, like the masters
    at real shapes, is never held whole). The header is written last into space reserved before the data and
    padded with spaces, as the format allows. Returns name -> `digest(tensor)` when `digest` is given."""
    names = list(tensors)
    reserve = 64 + len(json.dumps(metadata or {})) + sum(len(json.dumps(n)) + 200 for n in names)
    reserve += -(8 + reserve) % 8
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    from ..sync.payload import byte_view
    digests: dict[str, str] = {}
    off = 0
    with open(path, "wb") as f:
        f.seek(8 + reserve)
        for n in names:
            t = tensors[n].detach()
            if t.dtype not in ST_DTYPES:
                raise SnapshotError(f"{path}: tensor {n!r} has dtype {t.dtype}, which safetensors cannot store")
            data = byte_view(t) if t.numel() else b""
            f.write(data)
            size = t.numel() * t.element_size()
            header[n] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + size]}
            off += size
            if digest is not None:
                digests[n] = digest(t)
            del t, data
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) > reserve:               # cannot happen with the reserve above; never write a bad file
            raise SnapshotError(f"{path}: safetensors header needs {len(text)} bytes, {reserve} reserved")
        f.seek(0)
        f.write(struct.pack("<Q", reserve) + text + b" " * (reserve - len(text)))
    return digests


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


def snapshot_manifest(config, step: int | None, digests: bool = True, **snaps: Snapshot) -> dict:
    """What a snapshot directory records beside its tensors: the config that drove the sync (so `verify` runs
    the same checks elsewhere) and the model's spec, the exclusion set and layout map it implies, each role's
    typed record and the digest of every tensor (edits after capture are reported). `digests=False`: leave them
    to `write_snapshot_dir`, which computes them while it writes (each tensor read once)."""
    from ..sync.payload import tensor_digest
    out = {
        "model": config.model, "recipe": config.recipe.name, "sync": config.sync_mode, "step": step,
        "seed": config.seed, "config": config.to_dict(), "model_spec": config.spec.to_dict(),
        "exclusion": {"high_precision": sorted(config.high_precision), "fp8": sorted(config.fp8_tensors),
                      "ignored_layers": list(config.ignored_layers)},
        "layout": config.layout.to_json(),
        **{role: s.meta.to_json() for role, s in snaps.items() if role != "master"},
    }
    if digests:
        out["digests"] = {role: {n: tensor_digest(t) for n, t in s.tensors.items()} for role, s in snaps.items()}
    return out


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
    """Write the given roles' tensors and the manifest (a dict from `snapshot_manifest`, or a read Manifest).
    A manifest without digests gets them computed as the tensors are written."""
    from ..sync.payload import tensor_digest
    if isinstance(manifest, Manifest):
        from ..schema import to_data
        manifest = {k: v for k, v in to_data(manifest).items() if k not in ("format", "format_version")}
    prepare_out_dir(path)
    fill = "digests" not in manifest
    digests: dict[str, dict[str, str]] = {}
    try:
        for role, fname in FILES.items():
            if role in snaps:
                fp = os.path.join(path, fname)
                digests[role] = write_safetensors(fp, snaps[role].tensors, {"role": role},
                                                  tensor_digest if fill else None)
                _public(fp)
        if fill:
            manifest = {**manifest, "digests": digests}
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
        snaps[role] = Snapshot(role, LazyTensors(fp), metas[role])
    return SnapshotDir(path, manifest, raw, **snaps)


def _data(x):
    """`x` as JSON reads it back (tuples as lists): the manifest's fields compare with the config's that way."""
    return json.loads(json.dumps(x, default=str))


def check_manifest(manifest: Manifest, config, where: str) -> None:
    """The manifest's fields agree with each other: the top-level model / recipe / sync / seed with `config` (the
    manifest's own `config`, the one the checks run under), the model's spec, the exclusion set and the layout map
    it records with what that config derives, the step with the trainer's and the payload's versions, and every
    role has its digests. The first that disagrees is a SnapshotError naming both keys: a verdict under one of
    two configurations the snapshot claims would be a verdict on neither."""
    def bad(what):
        raise SnapshotError(f"{where}: {what}: the manifest disagrees with itself; re-create the snapshot with "
                            f"`fp8check snapshot`")
    for key, want, other in (("model", config.model, "config.model"), ("recipe", config.recipe.name, "config.recipe.name"),
                             ("sync", config.sync_mode, "config.sync_mode"), ("seed", config.seed, "config.seed")):
        if getattr(manifest, key) != want:
            bad(f"{key} is {getattr(manifest, key)!r} but {other} is {want!r}")
    spec = _data(config.spec.to_dict())
    if manifest.model_spec is not None and _data(manifest.model_spec) != spec:
        k = next(k for k in sorted(set(manifest.model_spec) | set(spec))
                 if _data(manifest.model_spec.get(k)) != spec.get(k))
        bad(f"model_spec.{k} is {manifest.model_spec.get(k)!r} but {config.model}'s spec has {spec.get(k)!r}")
    for key, want in (("high_precision", sorted(config.high_precision)), ("fp8", sorted(config.fp8_tensors)),
                      ("ignored_layers", list(config.ignored_layers))):
        got = getattr(manifest.exclusion, key)
        if _data(got) != _data(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            bad(f"exclusion.{key} " + (f"lists {extra[0]!r}, which config does not derive" if extra else
                                       f"lacks {missing[0]!r}, which config derives" if missing else
                                       "orders its entries otherwise than config derives them"))
    if _data(manifest.layout) != _data(config.layout.to_json()):
        bad("layout is not the layout map config derives")
    for role, meta in (("trainer", manifest.trainer), ("payload", manifest.payload)):
        if manifest.step is not None and meta.version is not None and meta.version != manifest.step:
            bad(f"{role}.version is {meta.version} but step is {manifest.step}")
    missing = [r for r in FILES if r not in manifest.digests]
    if missing:
        raise SnapshotError(f"{where}: digests.{missing[0]}: missing; without the digests taken at capture the "
                            f"snapshot's integrity cannot be checked: re-create it with `fp8check snapshot`")


def changed_since_capture(snap: SnapshotDir) -> list[str]:
    """Every way the tensors are not what the manifest recorded at capture, one line each naming the role, the
    tensor and what disagrees: a digest that differs, a tensor with no digest, a digest with no tensor, and a
    payload tensor whose record's digest is not its own while the receive report says it arrived intact (the
    report's claim is what lets a check take the wire's bytes as the trainer's without reading them). Each tensor
    is read once and not kept."""
    from ..sync.payload import digest_matches
    out = []
    for role in FILES:
        s, digests = getattr(snap, role), snap.manifest.digests.get(role, {})
        read = getattr(s.tensors, "read", s.tensors.__getitem__)
        names = set(s.names())
        for n in s.names():
            if n not in digests:
                out.append(f"{FILES[role]}: tensor {n!r} has no digest in {MANIFEST} (added since capture)")
                continue
            t = read(n)
            if not digest_matches(t, digests[n]):
                out.append(f"{FILES[role]}: tensor {n!r} changed since capture (its bytes do not have the digest "
                           f"{MANIFEST} records, {digests[n]})")
            elif role == "payload":
                rcv = snap.manifest.payload.receive
                flagged = set(rcv.digest_mismatch) if rcv is not None else set()
                for r in snap.manifest.payload.records:
                    if r.name == n and n not in flagged and r.digest != digests[n] and not digest_matches(t, r.digest):
                        out.append(f"{FILES[role]}: tensor {n!r} does not have its record's digest ({MANIFEST} "
                                   f"payload.records: {r.digest}) while the receive report lists no mismatch for it")
                        break
            del t
        out += [f"{FILES[role]}: tensor {n!r} is missing, {MANIFEST} records its digest (removed since capture)"
                for n in sorted(set(digests) - names)]
    return out
