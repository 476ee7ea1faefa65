"""Command line: `python -m svg_lib <command> ...`.

    python -m svg_lib plan --preset blog                  # the plan in words + ASCII tile map
    python -m svg_lib plan --preset blog --block-q 1024   # a preset with one value overridden
    python -m svg_lib compile --preset blog --target v6e  # compile every kernel for a TPU v6e (libtpu)
    python -m svg_lib plan --frames 21 --height 45 --width 80 --density 0.35 \\
        --block-q 3328 --block-kv 1536 --json             # plan.stats as one JSON object

The top layer of svg_lib: all argument parsing lives here, one module per command
(`svg_lib/cli/<command>.py`), each defining `COMMAND = Command(name, help, add_arguments, run)`
over the library's functions; `svg_lib.cli.common` holds the problem flags they share. Adding
a command: write that module and add it to `COMMANDS` below. `run` reports bad input by raising
`UsageError` (or a library `ValueError`): main prints it as one line and returns 2.

What every command does alike (svg_lib.cli.common):
  --preset NAME    start from a preset; the problem flags given override its values
  --json PATH      also write the results as JSON to PATH; `--json -` (or `--json` alone) prints
                   them on stdout as one line in place of the table, every other line on stderr
  output paths     a file or folder to write is checked while the flags are read; a missing
                   folder is created when the first file is written
  refusals         one line on stderr, `python -m svg_lib COMMAND: error: ...`, exit status 2
  --quiet          no progress bars or progress lines; long commands show them on stderr
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import warnings

from svg_lib import __version__
from svg_lib.cli import bench, cost, frontier, lower, plan, report, sharded, tune, vmem
from svg_lib.cli import compile as compile_command  # the module, not the builtin
from svg_lib.cli.common import PROG, Command, _Parser, add_common_arguments, json_to_stdout
from svg_lib.core.masks import DensityFloorWarning
from svg_lib.environment import MissingCompiler
from svg_lib.progress import set_quiet

COMMANDS: tuple[Command, ...] = tuple(m.COMMAND for m in (plan, bench, lower, compile_command, tune, cost, vmem,
                                                          sharded, report, frontier))


def commands() -> list[Command]:
    """Every command, in the order `--help` lists them."""
    return list(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="svg_lib: tile-aligned sparse video attention, from the command line")
    parser.add_argument("--version", action="version", version=f"svg_lib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands():
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
        add_common_arguments(command_parser)
        command_parser.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, return its exit status.

    Bad input gives one line on stderr and status 2, never a traceback.
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version and argparse errors: return instead of exiting
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    set_quiet(args.quiet)  # every command's progress bars (svg_lib.progress), for this run
    args._command_line = f"{PROG} {shlex.join(argv)}"  # as typed: what a report records
    args._stdout = sys.stdout  # where --json - prints, while the command's other lines go to stderr
    to_stderr = contextlib.redirect_stdout(sys.stderr) if json_to_stdout(args) else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), to_stderr:  # svg_lib's warnings as one line each, like its errors
            shown = warnings.showwarning

            def one_line(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, DensityFloorWarning):
                    print(f"{PROG} {args.command}: warning: {message}", file=sys.stderr, flush=True)
                else:
                    shown(message, category, filename, lineno, file, line)
            warnings.showwarning = one_line
            return int(args._run(args))
    except ValueError as err:  # UsageError, or the library refusing a value it was given
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 2
    except MissingCompiler as err:  # the TPU compiler is needed and not installed: what to install
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the checks passed that failed after all (the disk filled, a folder went away)
        where = f": {err.filename}" if err.filename else ""
        print(f"{PROG} {args.command}: error: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
