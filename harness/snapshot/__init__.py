from .disk import (FILES, MANIFEST, SnapshotDir, SnapshotError, read_snapshot_dir, snapshot_manifest,
                   write_snapshot_dir)
from .model import Snapshot

__all__ = ["FILES", "MANIFEST", "Snapshot", "SnapshotDir", "SnapshotError", "read_snapshot_dir", "snapshot_manifest",
           "write_snapshot_dir"]
