"""The fault-injection matrix: every applicable fault x tiny model x recipe through the one pipeline with the CPU
reference engines, plus one clean run per model x recipe. A fault is caught when every invariant it declares
must fire failed (all-must-trip; some of them is `partial`, none `missed`, both fail the matrix); an invariant
that fired without being declared (must or may) is listed on the cell as `undeclared`. A clean run passes when
every invariant holds (no fail, no unknown).

A cell the fault does not apply to is `n/a` (its `applies` excludes the configuration) or `no-target` (its
injector raised `NoTarget`, saying why); any other exception, in the injector or anywhere in the cell, is an
`error` that fails the matrix."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from fp8check.harness.config import ConfigError, SyncConfig, recommended_config
from fp8check.harness.engines.protocol import EngineError
from fp8check.harness.formats import RECIPES
from fp8check.harness.layouts import LayoutError
from fp8check.harness.models import MODELS
from fp8check.harness.sync.pipeline import fault_config, reference_differential, reference_sync
from fp8check.invariants import REGISTRY, CheckContext, FAIL, UNKNOWN, run_catalog

from .base import FAULTS, Fault, NoTarget
from .beside import beside_the_sender, pack_beside
from fp8check.harness.kinds import Stage

STATIC_FAMILIES = ("contract", "exclusion", "alignment")
TINY_MODELS = ("tiny-dense", "tiny-moe", "tiny-hybrid")
# host memory of one cell (reference sync + catalog) per model parameter, measured on a 1-layer Qwen3-8B shape
# (1.44 B parameters, 1.24 B of them the two vocabulary matrices): a clean cell 9.1 B/param (the trainer's export,
# the received buckets, the engine and its captured copy, plus temporaries); a fault cell (scale_x2_block) passed
# 24 GB, above 17 B/param, and was killed
CELL_BYTES_PER_PARAM = 20


# the reference engines receive in this process, beside the sender: the digest check compares bytes with the
# sender's tensors, or knows them from the packing (faults.beside), the same report as hashing them
# (tests/test_matrix_shortcuts.py)
PACK, RECEIVE = pack_beside, beside_the_sender

SKIPPED = ("n/a", "no-target")      # cells where the fault injects nothing, each saying why


@dataclass
class Cell:
    fault: str | None
    model: str
    recipe: str
    expected: tuple = ()
    fired: list = field(default_factory=list)
    unknown: list = field(default_factory=list)
    verdict: str = ""               # caught | partial | missed | pass | false-alarm | n/a | no-target | error
    undeclared: list = field(default_factory=list)   # fired, declared neither must nor may
    detail: str = ""
    seconds: float = 0.0
    findings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict in ("caught", "pass") + SKIPPED

    def to_json(self) -> dict:
        return {"fault": self.fault or "clean", "model": self.model, "recipe": self.recipe,
                "expected": list(self.expected), "fired": self.fired, "unknown": self.unknown, "verdict": self.verdict,
                "undeclared": self.undeclared,
                "detail": self.detail, "seconds": round(self.seconds, 3),
                "findings": [f.to_json() for f in self.findings[:6]]}


def check_config(config: SyncConfig, fault: Fault | None = None, *, probes: bool = False, without=()):
    """Run the sync (through the fault's stage) and the catalog: the S family and every config rule always; the
    costlier data checks (C1 re-quantizes every master, P1 runs three forwards) on clean runs and where a fault
    declares them. `without`: invariants left out of the catalog (the ablation audit). Returns (findings, note)."""
    ids = None
    if fault is not None and not probes:
        ids = [i for i, inv in REGISTRY.items() if inv.family == "sync" or inv.scope == "config" or i in fault.declared]
    if without:
        ids = [i for i in (ids if ids is not None else REGISTRY) if i not in without]
    # the engine's own log-probs on the probe prompts, where P1 judges (a policy no snapshot shows)
    probe = fault is None or probes or "P1" in fault.declared
    try:
        if fault is None or "R3" in fault.declared:    # clean runs include the cold-vs-warm differential
            res, _, _ = reference_differential(config, fault=fault, check_ids=ids, probes=probe, receive=RECEIVE,
                                               pack=PACK)
        else:
            # a serving fault happens to an engine that already served a sync (what the sleep / wake then keeps)
            steps = 2 if fault.stage == Stage.SERVING else 1
            res, _, _ = reference_sync(config, fault=fault, check_ids=ids, probes=probe, steps=steps,
                                       receive=RECEIVE, pack=PACK)
    except (LayoutError, EngineError, ConfigError) as e:
        # the engines cannot even be built from this configuration: the static rules must say why
        static = run_catalog(CheckContext(config), families=STATIC_FAMILIES, static_only=True)
        return [f for f in static if f.invariant_id not in without], f"sync impossible: {e}"
    return res.findings, ""


def run_cell(fault: Fault | None, model: str, recipe: str, probes: bool = False, without=()) -> Cell:
    """One matrix cell. `without`: run the catalog minus these invariants (what the cell's verdict owes them)."""
    t0 = time.perf_counter()
    cell = Cell(fault.name if fault else None, model, recipe, tuple(fault.trips) if fault else ())
    base = recommended_config(model, recipe)
    try:
        if fault is not None and not fault.applies(base):
            cell.verdict, cell.detail = "n/a", "the fault's `applies` excludes this configuration"
            return cell
        findings, cell.detail = check_config(fault_config(base, fault), fault, probes=probes or fault is None,
                                             without=without)
    except NoTarget as e:               # the injector says it found nothing to corrupt here, and why
        cell.verdict, cell.detail = "no-target", str(e)
        return cell
    except Exception as e:  # noqa: BLE001 - a crash is a matrix error, never a pass
        cell.verdict, cell.detail = "error", f"{e.__class__.__name__}: {e}"
        cell.seconds = time.perf_counter() - t0
        return cell
    cell.fired = sorted({f.invariant_id for f in findings if f.verdict == FAIL})
    cell.unknown = sorted({f.invariant_id for f in findings if f.verdict == UNKNOWN})
    cell.findings = [f for f in findings if f.verdict != "pass"]
    if fault is None:
        cell.verdict = "pass" if not cell.fired and not cell.unknown else "false-alarm"
    else:
        cell.verdict = fault.verdict(cell.fired)
        cell.undeclared = fault.undeclared(cell.fired)
    cell.seconds = time.perf_counter() - t0
    return cell


def matrix_cells(models=None, recipes=None, faults=None) -> list[tuple]:
    models = list(models or [m for m in MODELS if m in TINY_MODELS])
    recipes = list(recipes or RECIPES)
    names = list(faults or FAULTS)
    out = [(None, m, r) for m in models for r in recipes]
    out += [(n, m, r) for n in names for m in models for r in recipes]
    return out


def available_memory() -> int:
    """MemAvailable of this machine in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def largest_model(models=None) -> str:
    """The model with the most parameters: its cells bound the matrix's memory."""
    from fp8check.harness.models import get_model
    return max(models or TINY_MODELS, key=lambda m: get_model(m).num_params())


def cell_bytes(models=None) -> int:
    """Host memory the largest model's cell needs (estimate)."""
    from fp8check.harness.models import get_model
    return get_model(largest_model(models)).num_params() * CELL_BYTES_PER_PARAM + (1 << 30)


def memory_workers(models=None) -> int | None:
    """How many cells fit in this machine's available memory at once (0: not one; None: no limit known)."""
    avail = available_memory()
    if not avail:
        return None
    return avail // cell_bytes(models)


def run_matrix(models=None, recipes=None, faults=None, workers: int = 1, progress=None) -> list[Cell]:
    """Every cell, in matrix order. `progress(done, total)` is called as cells finish."""
    cells = matrix_cells(models, recipes, faults)
    out = []
    if workers <= 1:
        for i, (n, m, r) in enumerate(cells):
            out.append(run_cell(FAULTS[n] if n else None, m, r))
            if progress:
                progress(i + 1, len(cells))
        return out
    return _run_grouped(cells, workers, progress)


# cells a worker is handed at a time (small: the last cells of a group can still move to an idle worker)
BATCH = 4
# a worker whose groups are done takes the tail half of another worker's group only when that many cells remain:
# starting a group costs its memoized state (the engines' start-up, the reference forwards), about a second
STEAL_MIN = 16


def _group_cost(key, n: int) -> float:
    """A group's expected cost (cells x the model's size): the largest groups start first."""
    from fp8check.harness.models import get_model
    return n * get_model(key[0]).num_params()


def _run_grouped(cells: list[tuple], workers: int, progress=None) -> list[Cell]:
    """Cells on `workers` processes, each (model, recipe) group kept on one worker where it can be: the memos
    (engine start-up states, the reference export, the forwards by state content) live per process, so a group
    spread over every worker pays its warm-up once per worker. Groups start largest first; a worker with nothing
    left of its own takes the tail of the largest unfinished group. Results come back in matrix order."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    groups: dict = {}
    for i, (n, m, r) in enumerate(cells):
        groups.setdefault((m, r), []).append(i)
    todo = sorted(groups, key=lambda k: -_group_cost(k, len(groups[k])))
    queues = {k: list(groups[k]) for k in todo}
    ctx = mp.get_context()
    procs, conns, current = [], [], {}
    out: list = [None] * len(cells)
    done = 0

    started: set = set()

    def next_batch(w):
        g = current.get(w)
        if g is None or not queues[g]:
            g = next((k for k in todo if k not in started and queues[k]), None)
            if g is None:                 # steal: the tail half of the group with the most cells left
                g = max(queues, key=lambda k: len(queues[k]))
                if len(queues[g]) < STEAL_MIN:
                    return None
                half = len(queues[g]) // 2
                queues[g], stolen = queues[g][:half], queues[g][half:]
                g = (*g, len(queues))
                queues[g] = stolen
            started.add(g)
            current[w] = g
        batch, queues[g] = queues[g][:BATCH], queues[g][BATCH:]
        return [(i, cells[i]) for i in batch]

    finished = False
    try:
        for w in range(min(workers, len(cells))):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        live = {}
        for w, c in enumerate(conns):
            b = next_batch(w)
            if b is None:
                c.send(None)
            else:
                c.send(b)
                live[c] = w
        while live:
            for c in wait(list(live)):
                w = live[c]
                try:
                    msg = c.recv()
                except EOFError:
                    raise RuntimeError(f"fault-matrix worker {w} died (exit code {procs[w].exitcode})") from None
                if isinstance(msg, BaseException):
                    raise msg
                for i, cell in msg:
                    out[i] = cell
                    done += 1
                    if progress:
                        progress(done, len(cells))
                b = next_batch(w)
                if b is None:
                    c.send(None)
                    del live[c]
                else:
                    c.send(b)
        finished = True
    finally:
        for p in procs:                   # every worker was sent None; after an error the others are ended
            if p.is_alive() and finished:
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return out


# glibc hands freed blocks above its mmap threshold (dynamic, at most 32 MiB) back to the kernel, and the next
# tensor of that size faults in fresh zeroed pages: a cell allocates and frees its engines' and checks' buffers
# hundreds of times. A worker that keeps them in its heap spends ~40 % fewer page faults and ~15 % less time
# (tiny models, 2 workers); blocks above 64 MiB (real shapes) are still mapped and returned.
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20


def _keep_freed_memory():
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):   # not glibc: its allocator as it is
        return
    mallopt(-3, MMAP_THRESHOLD)          # M_MMAP_THRESHOLD
    mallopt(-1, TRIM_THRESHOLD)          # M_TRIM_THRESHOLD


def _worker(conn):
    """A matrix worker: run the batches of cells it is sent until it is sent None."""
    import torch
    torch.set_num_threads(1)            # one process per core
    _keep_freed_memory()
    from fp8check import faults  # noqa: F401  (registers in a fresh worker)
    while True:
        batch = conn.recv()
        if batch is None:
            return
        try:
            res = []
            for i, (n, m, r) in batch:
                c = run_cell(FAULTS[n] if n else None, m, r)
                c.findings = c.findings[:6]
                res.append((i, c))
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
            conn.send(e)
            return
        conn.send(res)


def summary(cells: list[Cell]) -> dict:
    applicable = [c for c in cells if c.verdict not in SKIPPED]
    return {"cells": len(cells), "applicable": len(applicable), "not_applicable": sum(c.verdict == "n/a" for c in cells),
            "no_target": sum(c.verdict == "no-target" for c in cells),
            "clean_pass": sum(c.verdict == "pass" for c in cells),
            "false_alarms": sum(c.verdict == "false-alarm" for c in cells),
            "caught": sum(c.verdict == "caught" for c in cells), "missed": sum(c.verdict == "missed" for c in cells),
            "partial": sum(c.verdict == "partial" for c in cells),
            "undeclared": sum(bool(c.undeclared) for c in cells),
            "errors": sum(c.verdict == "error" for c in cells),
            "ok": all(c.ok for c in cells)}
