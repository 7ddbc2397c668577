"""Snapshots: read-only views of an engine's numeric state plus its typed record, and their on-disk form.
Names load on first use (`harness.lazy.lazy_exports`)."""
from ..lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    ".disk": ("FILES", "MANIFEST", "Manifest", "SnapshotDir", "SnapshotError", "prepare_out_dir", "read_manifest",
              "read_snapshot_dir", "snapshot_manifest", "write_snapshot_dir"),
    ".model": ("Snapshot",),
})
