"""`fp8check` command line (also `python -m harness`). The CLI package (with its reporters) sits on top of
everything: it is the only place that imports harness, invariants, faults and e2e together. Exit codes: 0 all checks hold, 1 a check failed,
2 bad input (one line on stderr naming the file / key / tensor and what to do; never a traceback)."""
from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from ..config import SyncConfig
from ..errors import BadInput, ConfigError, UsageError
from ..formats.recipe import RECIPES
from ..models import BUILTIN, SHIPPED, with_layers

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


# -- config from the command line ---------------------------------------------------------------------------------
def parse_sets(items: list[str] | None, flag: str = "--set") -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise UsageError(f"{flag} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError:
            out[k.strip()] = v
    return out


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}); a job config is YAML text") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', None) or e.__class__.__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def build_config(args) -> SyncConfig:
    data: dict = {}
    source = "command line"
    if getattr(args, "config", None):
        data = load_yaml(args.config)
        source = args.config
    for k in ("model", "recipe", "seed"):
        v = getattr(args, k, None)
        if v is not None:
            data[k] = v
    if getattr(args, "sync", None):
        data["sync_mode"] = args.sync
    data.update(parse_sets(getattr(args, "set", None)))
    layers = getattr(args, "layers", None)
    if layers is not None:
        model = data.get("model", "tiny-dense")
        if not isinstance(model, str):
            raise ConfigError(f"{source}: model must be a name or a path, got {model!r}")
        data["model"] = with_layers(model, layers)
    return SyncConfig.from_dict(data, source)


MODEL_HELP = (f"a built-in model ({', '.join(BUILTIN)}), a shipped config of a real model's shapes "
              f"({', '.join(SHIPPED)}), or a path to a Hugging Face config.json / checkpoint directory")
LAYERS_HELP = "keep only the first N layers (every per-layer shape stays real: a 1-layer Qwen3-8B is 1.4 B parameters)"


# -- commands -------------------------------------------------------------------------------------------------------
def cmd_catalog(args) -> int:
    from .catalog import catalog_rows
    rows = catalog_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    from rich.table import Table
    from .report import console
    t = Table(title="fp8check invariant catalog")
    for c in ("id", "family", "title", "condition", "source", "faults that must trip it"):
        t.add_column(c, overflow="fold")
    for r in rows:
        trips = ", ".join(r["faults"]) + (f" (backstop: fires beside others on {r['backstop']})" if r["backstop"]
                                          else "")
        t.add_row(r["id"], r["family"], r["title"], r["condition"], r["source"], trips)
    console().print(t)
    return EXIT_OK


def cmd_snapshot(args) -> int:
    if args.engine != "cpu":
        raise UsageError(f"--engine {args.engine}: only the cpu reference writes snapshots here; live engines "
                         f"are checked with `fp8check live`")
    from ..snapshot import prepare_out_dir
    prepare_out_dir(args.out)
    config = build_config(args)
    from .snapshot import write_reference_snapshot
    summary = write_reference_snapshot(config, args.out, steps=args.steps)
    print(summary)
    return EXIT_OK


def cmd_verify(args) -> int:
    from .snapshot import verify_dir
    out_file(args.junit, "--junit")
    return verify_dir(args.dir, as_json=args.json, junit=args.junit, allow_unknown=args.allow_unknown)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and a hint), not the usage block."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def count(minimum: int):
    """argparse type: an integer >= minimum."""
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{n} must be >= {minimum}")
        return n
    parse.__name__ = f"integer >= {minimum}"
    return parse


def out_file(path: str | None, what: str) -> str | None:
    """Check an output file's path before anything is computed: its directory exists and is writable, and the
    path is not a directory."""
    if path is None:
        return None
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{what} {path}: is a directory; give a file path")
    if not os.path.isdir(d):
        raise UsageError(f"{what} {path}: directory {d} does not exist")
    if not os.access(d, os.W_OK):
        raise UsageError(f"{what} {path}: directory {d} is not writable")
    return path


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`command`: the one that will run, when known; commands whose arguments need heavy imports register them
    only when they are the one."""
    p = OneLineParser(prog="fp8check", description="Correctness harness for FP8 RL weight sync.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=OneLineParser)

    c = sub.add_parser("catalog", help="list every invariant: id, family, condition, source, faults that trip it")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_catalog)

    def cfg_args(sp, model_default=None):
        sp.add_argument("--config", help="SyncConfig YAML (nested or dotted keys)")
        sp.add_argument("--model", default=model_default, metavar="MODEL", help=MODEL_HELP)
        sp.add_argument("--layers", type=int, metavar="N", help=LAYERS_HELP)
        sp.add_argument("--recipe", choices=sorted(RECIPES))
        sp.add_argument("--seed", type=count(0))
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")

    s = sub.add_parser("snapshot", help="run one reference sync and write a snapshot directory")
    s.add_argument("--engine", default="cpu", choices=["cpu", "vllm"])
    cfg_args(s, model_default="tiny-dense")
    s.add_argument("--sync", choices=["onpolicy", "naive"])
    s.add_argument("--steps", type=count(1), default=1, help="optimizer steps before the sync under test")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_snapshot)

    v = sub.add_parser("verify", help="run the catalog on a snapshot directory")
    v.add_argument("dir")
    v.add_argument("--json", action="store_true")
    v.add_argument("--junit", metavar="FILE")
    v.add_argument("--allow-unknown", action="store_true", help="exit 0 when checks are only unknown")
    v.set_defaults(fn=cmd_verify)

    from . import bench as bench_cmd, e2e as e2e_cmd, faults as faults_cmd, live as live_cmd, preflight as preflight_cmd
    bench_cmd.register(sub, count)
    e2e_cmd.register(sub, selected=command == "e2e")
    faults_cmd.register(sub)
    live_cmd.register(sub, cfg_args)
    preflight_cmd.register(sub)
    return p


def _quiet_stdout():
    """The reader went away (`fp8check catalog --json | head`): drop what is left, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    args.argv = argv
    try:
        rc = args.fn(args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        _quiet_stdout()
        return 141                      # 128 + SIGPIPE, as a Unix tool killed by a closed pipe
    except BadInput as e:
        print(f"fp8check {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one line, never a traceback, unless asked for
        if os.environ.get("FP8CHECK_DEBUG"):
            raise
        print(f"fp8check {args.cmd}: internal error: {e.__class__.__name__}: {e} (set FP8CHECK_DEBUG=1 for a "
              f"traceback and report it)", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
