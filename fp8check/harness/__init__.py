"""fp8check's stack: formats, layouts, config, the sync road, engines, snapshots, the CLI. Internal; the
public face is the `fp8check` package (fp8check/__init__.py)."""
