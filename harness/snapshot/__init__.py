"""Snapshots: read-only views of an engine's numeric state plus its typed record, and their on-disk form."""
from .disk import (FILES, MANIFEST, Manifest, SnapshotDir, SnapshotError, prepare_out_dir, read_manifest,
                   read_snapshot_dir, snapshot_manifest, write_snapshot_dir)
from .model import Snapshot

__all__ = ["FILES", "MANIFEST", "Manifest", "Snapshot", "SnapshotDir", "SnapshotError", "prepare_out_dir",
           "read_manifest", "read_snapshot_dir", "snapshot_manifest", "write_snapshot_dir"]
