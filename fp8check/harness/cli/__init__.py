"""`fp8check` command line (also `python -m harness`). The CLI package (with its reporters) sits on top of
everything: it is the only place that imports harness, invariants, faults and e2e together. Exit codes: 0 all checks hold, 1 a check failed,
2 bad input (one line on stderr naming the file / key / tensor and what to do; never a traceback)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import BadInput, ConfigError, UsageError  # noqa: F401 - re-exported (the CLI's error types)
from ..formats.recipe import RECIPES

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


from .args import LAYERS_HELP, MODEL_HELP, build_config, count, load_yaml, out_file, parse_sets  # noqa: F401


# -- commands -------------------------------------------------------------------------------------------------------
def cmd_catalog(args) -> int:
    from .catalog import catalog_markdown, catalog_rows
    rows = catalog_rows()
    if args.markdown:
        print(catalog_markdown(rows))
        return EXIT_OK
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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`command`: the one that will run, when known; commands whose arguments need heavy imports register them
    only when they are the one."""
    p = OneLineParser(prog="fp8check", description="Correctness harness for FP8 RL weight sync.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=OneLineParser)

    c = sub.add_parser("catalog", help="list every invariant: id, family, condition, source, faults that trip it")
    c.add_argument("--json", action="store_true")
    c.add_argument("--markdown", action="store_true", help="the documentation's reference pages (invariants, pre-flight rules)")
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
