"""`python -m svg_lib compile`: compile the kernels for a TPU generation with libtpu."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
from dataclasses import asdict

from svg_lib.chips import DEFAULT_TARGET, TARGETS, targets_table
from svg_lib.cli.common import (
    Command,
    UsageError,
    add_config_arguments,
    add_json_argument,
    block_sizes,
    config_from_args,
    emit_json,
    methods_from_args,
    show,
)
from svg_lib.environment import INSTALL_HINT, has_libtpu, libtpu_version
from svg_lib.problem import PALLAS_METHODS
from svg_lib.progress import write
from svg_lib.instruments.tpu.compiler import check_targets, compile_all
from svg_lib.instruments.tpu.lowering import splash_note


def _compile_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--target", action="append", metavar="NAME",
                        help=f"TPU generation to compile for: {', '.join(TARGETS)} or all; may be given "
                             f"several times (default {DEFAULT_TARGET})")
    parser.add_argument("--list-targets", action="store_true",
                        help="print the targets with their VMEM, SMEM and MXU facts (with --json, as JSON) and exit")
    parser.add_argument("--sweep-block-q", metavar="BQ,...", type=block_sizes,
                        help="compile at each of these query blocks in turn (instead of --block-q's one)")
    parser.add_argument("--no-estimate-check", action="store_true",
                        help="compile even where the VMEM estimate says the blocks will not fit")
    add_json_argument(parser, "also write the reports as JSON to PATH")


def _compile_run(args: argparse.Namespace) -> int:
    if args.list_targets:
        show(args, targets_table())
        emit_json(args, [asdict(t) for t in TARGETS.values()])
        return 0
    try:
        targets = check_targets(args.target or [DEFAULT_TARGET])
    except ValueError as err:
        raise UsageError(f"--target: {err}") from None
    config = config_from_args(args)
    configs = [dataclasses.replace(config, block_q=bq) for bq in args.sweep_block_q or [config.block_q]]
    methods = methods_from_args(args, default=PALLAS_METHODS)
    if "reference" in methods:
        raise UsageError(f"--methods: 'reference' is plain jax.numpy, nothing to compile for TPU; "
                         f"choose from {', '.join(PALLAS_METHODS)}")
    if not has_libtpu():
        raise UsageError("the TPU compiler (libtpu) is not installed. Install it with: " + INSTALL_HINT)
    import jax

    sweep = f" at block_q {', '.join(str(c.block_q) for c in configs)}" if args.sweep_block_q else ""
    print(f"compile for TPU ({', '.join(t.name for t in targets)}; libtpu {libtpu_version()}, compile-only on "
          f"this CPU, nothing runs), jax {jax.__version__}: {config.describe()}{sweep}", flush=True)
    if splash_note(config, methods):
        print(splash_note(config, methods), flush=True)
    reports = []
    for one in configs:
        reports += compile_all(one, methods, targets, progress=lambda r: write(r.line()),
                               check_estimate=not args.no_estimate_check, bar=True)
    failed = [f"{r.method} {r.block_q}x{r.block_kv} on {r.target}" for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} compiled"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + ". Compiled for TPU by libtpu: VMEM/SMEM allocation and Mosaic checked; no speed measured.",
          flush=True)
    if args.json:
        emit_json(args, {"config": config.to_json(), "sweep_block_q": [c.block_q for c in configs],
                         "date": datetime.date.today().isoformat(), "jax": jax.__version__,
                         "libtpu": libtpu_version(), "targets": [asdict(t) for t in targets],
                         "reports": [r.to_json() for r in reports]})
    return 1 if failed else 0


COMMAND = Command("compile", "compile the Pallas kernels for a TPU generation with the real TPU compiler "
            "(libtpu, on this CPU; nothing runs)", _compile_arguments, _compile_run)
