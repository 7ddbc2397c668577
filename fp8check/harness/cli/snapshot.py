"""`fp8check snapshot` and `fp8check verify`."""
from __future__ import annotations

import os

from ..config import ConfigError, SyncConfig
from ..models import MODELS, ModelError, ModelSpec, register_model
from ..snapshot import (FILES, MANIFEST, SnapshotError, prepare_out_dir, read_snapshot_dir, snapshot_manifest,
                        write_snapshot_dir)
from ..snapshot.disk import changed_since_capture, check_manifest
from ..sync.pipeline import reference_sync
from .report import console, findings_json, junit_xml, print_findings


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
    """The checks' context for a snapshot directory, and every way its tensors are not what the manifest recorded
    at capture (`changed_since_capture`). A manifest that disagrees with itself, masters or trainer tensors that do
    not fit the model, are a SnapshotError (exit 2). The receive report's digests stand for the wire's bytes
    (`CheckContext.wire_digests`) only where every payload tensor was found as captured here; otherwise the wire is
    judged by its bytes, as the engine state is."""
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
    check_manifest(snap.manifest, config, where)
    # tensors not as captured (read one at a time and not kept: at real shapes the roles together are many
    # gigabytes): the catalog still judges them, and the verdict is never a pass (verify_dir)
    changed = changed_since_capture(snap)
    _check_masters(config, snap.master, os.path.join(path, FILES["master"]))
    _check_trainer(config, snap.trainer, os.path.join(path, FILES["trainer"]))
    ctx = CheckContext(config, payload=snap.payload, trainer=snap.trainer, rollout=snap.rollout, master=snap.master,
                       wire_digests=not any(c.startswith(FILES["payload"]) for c in changed))
    return ctx, changed


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


def _check_trainer(config: SyncConfig, trainer, where: str):
    """The trainer's tensors are the reference every check compares with: a model tensor of another shape than the
    model's, or an FP8 weight's scale_inv off the trainer's recipe grid, is a bad snapshot naming the tensor."""
    from ..layouts import scale_name
    shape = getattr(trainer.tensors, "shape", lambda n: tuple(trainer[n].shape))
    names = set(trainer.names())
    for t in config.spec.tensors():
        want = {t.name: tuple(t.shape)}
        if t.name in config.trainer_fp8_tensors:
            want[scale_name(t.name)] = tuple(config.trainer_recipe.scale_grid(t.shape))
        for n, w in want.items():
            if n in names and shape(n) != w:
                raise SnapshotError(f"{where}: tensor {n!r} has shape {list(shape(n))}, {config.model} under "
                                    f"{config.trainer_recipe.name} needs {list(w)}; re-create the snapshot with "
                                    f"`fp8check snapshot`")


def verify_dir(path: str, as_json: bool = False, junit: str | None = None, allow_unknown: bool = False) -> int:
    """`fp8check verify`: the catalog on a snapshot directory. Exit 0 every check holds (1 with UNKNOWN unless
    `allow_unknown`), 1 a check failed, 2 a bad snapshot: unreadable, a manifest that disagrees with itself or with
    the model, or tensors changed since capture that no failing check explains (`changed_since_capture`; where a
    check fails, exit 1 and the changes are listed beside the findings)."""
    from fp8check.invariants import overall, run_catalog
    ctx, changed = context_from_dir(path)
    findings = run_catalog(ctx)
    verdict = overall(findings)
    if changed and verdict != "fail":
        raise SnapshotError(f"{path}: {changed[0]}" + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
                            + "; the snapshot is not what was captured: re-create it with `fp8check snapshot`")
    if as_json:
        print(findings_json(findings, snapshot=path, changed_since_capture=changed))
    else:
        c = console()
        shown = [f for f in findings if f.verdict != "pass"] or [f for f in findings if f.message]
        print_findings(c, shown, title=f"fp8check verify {path}")
        if changed:
            c.print(f"[bold red]not as captured[/] ({len(changed)}):", soft_wrap=True)
            for line in changed[:10]:
                c.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)
            if len(changed) > 10:
                c.print(f"  ... and {len(changed) - 10} more (--json lists them)", soft_wrap=True)
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
