"""`fp8check snapshot` and `fp8check verify`."""
from __future__ import annotations

import os

from ..config import ConfigError, SyncConfig
from ..models import MODELS, ModelError, ModelSpec, register_model
from ..snapshot import (FILES, MANIFEST, SnapshotError, prepare_out_dir, read_snapshot_dir, snapshot_manifest,
                        write_snapshot_dir)
from ..sync.payload import digest_matches
from ..sync.pipeline import reference_sync
from .report import console, findings_json, findings_table, junit_xml


def write_reference_snapshot(config: SyncConfig, out: str, steps: int = 1) -> str:
    prepare_out_dir(out)                      # before anything is computed
    result = reference_sync(config, steps=steps, checks=False)[0]     # the engines go; their snapshots stay
    snaps = dict(master=result.master, trainer=result.trainer, payload=result.payload, rollout=result.rollout)
    # digests are computed as each tensor is written (the masters are generated once, one at a time)
    write_snapshot_dir(out, snapshot_manifest(config, result.version, digests=False, **snaps), **snaps)
    n = {role: len(s.tensors) for role, s in (("trainer", result.trainer), ("payload", result.payload),
                                              ("rollout", result.rollout))}
    return (f"wrote {out}/: {', '.join(FILES.values())}, {MANIFEST}  ({config.model}, {config.recipe.name}, "
            f"{config.sync_mode} sync, step {result.version}; trainer {n['trainer']} tensors, payload {n['payload']} "
            f"records, rollout {n['rollout']} parameters)")


def context_from_dir(path: str):
    from fp8check.invariants import CheckContext
    snap = read_snapshot_dir(path)
    where = f"{os.path.join(path, MANIFEST)}"
    spec = snap.manifest.model_spec
    if spec is not None and snap.manifest.model not in MODELS:      # a model read from a config.json elsewhere
        try:
            register_model(ModelSpec.from_dict(spec))
        except (TypeError, ValueError, ModelError) as e:
            raise SnapshotError(f"{where}: model_spec does not describe a model ({e})") from None
    try:
        config = SyncConfig.from_dict(snap.manifest.config, f"{where}: config")
    except ConfigError as e:
        raise SnapshotError(str(e)) from None
    # tensors edited after capture: reported beside the findings (the invariants judge the content)
    # (read one tensor at a time and not kept: at real shapes the roles together are many gigabytes, and the
    # masters' high-precision tensors are read by no check)
    tampered = []
    for role, digests in snap.manifest.digests.items():
        s = getattr(snap, role)
        read = getattr(s.tensors, "read", s.tensors.__getitem__)
        for n in s.names():
            if n in digests and not digest_matches(read(n), digests[n]):
                tampered.append(f"{role}:{n}")
    _check_masters(config, snap.master, os.path.join(path, FILES["master"]))
    ctx = CheckContext(config, payload=snap.payload, trainer=snap.trainer, rollout=snap.rollout, master=snap.master)
    return ctx, tampered


def _check_masters(config: SyncConfig, master, where: str):
    """The masters are the model's own tensors in checkpoint names and shapes (C1 re-quantizes them): a file that
    holds none of them, or one of the wrong shape, is a bad snapshot, not something a check can judge."""
    want = {t.name: tuple(t.shape) for t in config.spec.tensors()}
    names = master.names()
    if not set(names) & set(want):
        raise SnapshotError(f"{where}: holds none of {config.model}'s tensors (e.g. {next(iter(want))}); it is not "
                            f"this snapshot's masters: re-create the snapshot with `fp8check snapshot`")
    shape = getattr(master.tensors, "shape", lambda n: tuple(master[n].shape))
    for n in names:
        if n in want and shape(n) != want[n]:
            raise SnapshotError(f"{where}: tensor {n!r} has shape {list(shape(n))}, {config.model} needs "
                                f"{list(want[n])}; re-create the snapshot with `fp8check snapshot`")


def verify_dir(path: str, as_json: bool = False, junit: str | None = None, allow_unknown: bool = False) -> int:
    from fp8check.invariants import overall, run_catalog
    ctx, tampered = context_from_dir(path)
    findings = run_catalog(ctx)
    verdict = overall(findings)
    if as_json:
        print(findings_json(findings, snapshot=path, changed_since_capture=tampered))
    else:
        c = console()
        shown = [f for f in findings if f.verdict != "pass"] or [f for f in findings if f.message]
        c.print(findings_table(shown, title=f"fp8check verify {path}"))
        if tampered:
            c.print(f"[yellow]note:[/] {len(tampered)} tensor(s) changed since capture "
                    f"(manifest digests): {', '.join(tampered[:5])}{' ...' if len(tampered) > 5 else ''}")
        ids = {}
        for f in findings:
            ids.setdefault(f.invariant_id, []).append(f.verdict)
        line = "  ".join(f"{i}:{'FAIL' if 'fail' in v else ('unknown' if 'unknown' in v else 'ok')}"
                         for i, v in ids.items())
        c.print(f"{verdict.upper()}  {line}")
    if junit:
        cases = [("verify", f"{f.invariant_id} {f.tensor or ''}".strip(), f.verdict, f.message) for f in findings]
        with open(junit, "w") as fh:
            fh.write(junit_xml(f"fp8check verify {path}", cases))
    if verdict == "fail" or (verdict == "unknown" and not allow_unknown):
        return 1
    return 0


__all__ = ["context_from_dir", "verify_dir", "write_reference_snapshot"]
