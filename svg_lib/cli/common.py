"""What every command shares: the Command record, UsageError, and the problem flags."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import LANES, check_block_size
from svg_lib.problem import DEFAULT_METHODS, PRESETS, BenchConfig, get_preset
from svg_lib.progress import is_quiet
from svg_lib.instruments.tools.bench import check_methods

PROG = "python -m svg_lib"

class UsageError(ValueError):
    """Bad command-line input: printed as one line on stderr, exit status 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its arguments and what it does (returns the exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) so scripts can show them as they are."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- flags every command has -----------------------------------------------------------------

def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """What every command takes: --quiet (no progress bars; results and errors are printed as ever)."""
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars or progress lines on stderr (results and errors still print)")


def say(line: str) -> None:
    """A progress line on stderr, unless --quiet."""
    if not is_quiet():
        print(line, file=sys.stderr, flush=True)


# -- values checked while the flags are read (before any work) ---------------------------------

def argument_type(check: Callable, name: str) -> Callable:
    """An argparse `type` from a library check: its ValueError becomes argparse's one-line refusal
    (argparse would print only "invalid value" and drop the check's words)."""
    def parse(text):
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    parse.__name__ = name  # what argparse calls the type in its own messages
    return parse


def _integer(text: str, expected: str) -> int:
    """`int(text)`, or a ValueError saying what the flag expected (int's own words name no flag value)."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _integer(text, "a positive integer")
    if value < 1:  # 0 heads would reach the kernels as an empty grid
        raise ValueError(f"must be a positive integer (1 or more), got {value}")
    return value


def _block_size(text: str) -> int:
    return check_block_size("a tile size", _integer(text, f"a tile size, a multiple of {LANES} like 512"))


def _block_sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        sizes = []
    if not sizes:
        raise ValueError(f"expected comma-separated tile sizes, multiples of {LANES} like 128,256, got {text!r}")
    return [check_block_size("every tile size", size) for size in sizes]


def _block_pair(text: str) -> tuple[int, int]:
    block_q, sep, block_kv = text.partition("x")
    if not sep:
        raise ValueError(f"expected a pair of tile sizes like 1024x512 (block_q x block_kv), got {text!r}")
    return _block_size(block_q), _block_size(block_kv)


positive_int = argument_type(_positive_int, "positive int")
block_size = argument_type(_block_size, "tile size")       # one multiple of 128
block_sizes = argument_type(_block_sizes, "tile sizes")    # comma-separated multiples of 128
block_pair = argument_type(_block_pair, "tile pair")       # 1024x512: block_q x block_kv


# -- problem flags shared by every command ---------------------------------------------------

PROBLEM_DEFAULTS = {"text_tokens": 0, "heads": 2, "head_dim": 128, "dtype": "bfloat16"}


def add_preset_argument(parser: argparse.ArgumentParser, default: str | None = None, note: str = "",
                        overrides: bool = True) -> None:
    """`--preset NAME`, the same in every command that takes a problem: every preset offered, the
    default (if any) said, and (`overrides`) the problem flags given overriding its values."""
    said = f" (default {default}{note})" if default else (f" ({note.lstrip('; ')})" if note else "")
    tail = "; the problem flags given override its values" if overrides else ""
    parser.add_argument("--preset", choices=tuple(PRESETS), default=default,
                        help=f"the problem: a preset{said}{tail}")


def add_problem_arguments(parser: argparse.ArgumentParser, *, model: bool = True, blocks: bool = True,
                          preset: str | None = None) -> None:
    """The problem flags of plan, bench, lower, compile, tune and cost: a --preset (default `preset`),
    then explicit overrides.

    Defaults are None so that "not given" can be told from "given". `model` adds heads, head
    dim and dtype (what a kernel run needs); `blocks` adds one block size per axis.
    """
    add_preset_argument(parser, preset)
    parser.add_argument("--frames", type=int, metavar="F", help="latent frames")
    parser.add_argument("--height", type=int, metavar="H", help="tokens per frame, vertically")
    parser.add_argument("--width", type=int, metavar="W", help="tokens per frame, horizontally")
    parser.add_argument("--text-tokens", type=int, metavar="P", help="text tokens after the video (default 0)")
    parser.add_argument("--density", type=float, metavar="D", help="fraction of pairs the band keeps, in (0, 1]")
    parser.add_argument("--no-sink", action="store_true", help="leave out the first-frame sink")
    if model:
        parser.add_argument("--heads", type=positive_int, metavar="H",
                            help="attention heads (default 2 without a preset)")
        parser.add_argument("--head-dim", type=positive_int, metavar="D",
                            help="head dimension (default 128 without a preset)")
        parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                            help="dtype of q, k, v (default bfloat16 without a preset)")
    if blocks:
        parser.add_argument("--block-q", type=block_size, metavar="BQ", help="query tile size, a multiple of 128")
        parser.add_argument("--block-kv", type=block_size, metavar="BKV", help="key/value tile size, a multiple of 128")


def problem_values(args: argparse.Namespace, keys) -> dict:
    """Values for `keys` (flag names with underscores): preset values overridden by flags.

    Raises UsageError naming every flag that is still missing.
    """
    values = {key: PROBLEM_DEFAULTS.get(key) for key in keys}
    if args.preset is not None:
        p = get_preset(args.preset)
        g = p.geometry
        preset = dict(frames=g.frames, height=g.height, width=g.width, text_tokens=g.text_tokens, heads=p.heads,
                      head_dim=p.head_dim, density=p.density, block_q=p.block_q, block_kv=p.block_kv, dtype=p.dtype)
        values.update({key: preset[key] for key in keys if key in preset})
    for key in keys:
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    missing = ["--" + k.replace("_", "-") for k, v in values.items() if v is None]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}; give them, or start from --preset {'|'.join(PRESETS)}")
    return values


# -- command line: shared problem flags ------------------------------------------------------

def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The problem flags shared by `bench` and `lower`: a preset, then explicit overrides."""
    add_problem_arguments(parser)
    parser.add_argument("--block-kv-compute", type=block_size, metavar="C",
                        help="keys per inner step of a key tile: a multiple of 128 dividing --block-kv")
    parser.add_argument("--methods", metavar="M1,M2,...",
                        help=f"comma-separated methods (default {','.join(DEFAULT_METHODS)})")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the flags describe; bad values raise UsageError naming the flag."""
    values = problem_values(args, ("frames", "height", "width", "text_tokens", "heads", "head_dim", "density",
                                   "block_q", "block_kv", "dtype"))
    values["block_kv_compute"] = args.block_kv_compute
    try:
        geometry = VideoGeometry(values.pop("frames"), values.pop("height"), values.pop("width"),
                                 values.pop("text_tokens"))
        config = BenchConfig(geometry=geometry, first_frame_sink=not args.no_sink, **values)
        config.mask()  # e.g. a density too low for the text tokens
    except (TypeError, ValueError) as err:
        raise UsageError(f"{err} (check the flags)") from None
    return config


def methods_from_args(args: argparse.Namespace, default=DEFAULT_METHODS) -> tuple[str, ...]:
    if args.methods is None:
        return tuple(default)
    try:
        return check_methods([m.strip() for m in args.methods.split(",") if m.strip()])
    except ValueError as err:
        raise UsageError(f"--methods: {err}") from None


# -- output paths, checked when the flags are read (before any work) --------------------------
# Every flag that names a file or folder to write treats folders alike: a missing folder is created
# when the file is written (as `mkdir -p` would), so a path is refused only where nothing could be
# written: below a file, or in a folder that refuses new files.

OUTPUT_NOTE = "; a missing folder is created"

def _probe_folder(folder: str) -> str | None:
    """Why files cannot be written into the existing folder `folder`, or None when they can (tried,
    not asked: os.access says yes to root even on a read-only mount)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".svg_lib-write-check-"):
            return None
    except OSError as err:
        return err.strerror or type(err).__name__


def _check_folder(folder: str, what: str) -> None:
    """Refuse (one line) `what` unless `folder`, or its nearest existing parent when it is missing (it
    will be created), is a folder that takes files."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"cannot write {what}: {existing!r} is a file, not a folder")
    why = _probe_folder(existing)
    if why:
        raise argparse.ArgumentTypeError(f"cannot write {what}: the folder {existing!r} refuses new files ({why})")


def output_file(path: str) -> str:
    """An argparse `type` for a flag naming a file to write (its folder created if missing, by
    `create_parent` when the file is written). A bad path is refused while the flags are read, in one
    line, before any work is done."""
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path!r} is a folder; give a file name in it")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {path!r}: the file is read-only")
    _check_folder(os.path.dirname(path) or ".", repr(path))
    return path


def output_folder(path: str) -> str:
    """An argparse `type` for a flag naming a folder to write into (created, by `create_folder`, when
    the first file is written)."""
    _check_folder(path, f"into {path!r}")
    return path


def create_folder(path: str) -> str:
    """`path`, once it exists as a folder: what an `output_folder` flag promises before writing."""
    os.makedirs(path, exist_ok=True)
    return path


def create_parent(path: str) -> str:
    """`path`, once its folder exists: what an `output_file` flag promises before writing."""
    create_folder(os.path.dirname(path) or ".")
    return path


# -- --json [PATH]: every command's results as JSON, in a file or on stdout --------------------
# `--json PATH` writes the results to PATH (indented; "wrote PATH" on stderr) and the command prints
# what it always prints. `--json -`, or `--json` alone, prints them on stdout instead, as one line, in
# place of the command's table: stdout then holds only the JSON, and every other line the command
# prints goes to stderr (`main` redirects it), so `... --json | jq` always reads one object.

STDOUT = "-"
JSON_NOTE = "; - (or --json alone): the JSON alone on stdout, one line (tables left out, other lines on stderr)"


def json_output(path: str) -> str:
    """The argparse `type` of --json: "-" (stdout), or a file to write, checked as `output_file`."""
    return path if path == STDOUT else output_file(path)


def add_json_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The `--json [PATH]` flag every command that has results takes (`emit_json` writes them)."""
    parser.add_argument("--json", metavar="PATH", nargs="?", const=STDOUT, type=json_output,
                        help=f"{what}{OUTPUT_NOTE}{JSON_NOTE}")


def json_to_stdout(args: argparse.Namespace) -> bool:
    """True when --json asks for the JSON on stdout: the command then leaves out its table."""
    return getattr(args, "json", None) == STDOUT


def show(args: argparse.Namespace, text: str) -> None:
    """Print a command's table on stdout, unless the JSON takes its place there (--json -)."""
    if not json_to_stdout(args):
        print(text, flush=True)


def emit_json(args: argparse.Namespace, data) -> None:
    """`data` where --json asks: one line on the real stdout for "-", else the file PATH (its folder
    created if missing) and a "wrote PATH" line on stderr. Nothing without --json."""
    if args.json is None:
        return
    if json_to_stdout(args):
        stream = getattr(args, "_stdout", None) or sys.stdout  # main keeps it while stdout goes to stderr
        print(json.dumps(data), file=stream, flush=True)
        return
    write_json(args.json, data)
    print(f"wrote {args.json}", file=sys.stderr, flush=True)


def write_json(path: str, data) -> None:
    """`data` as indented JSON in `path`, its folder created if missing."""
    with open(create_parent(path), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
