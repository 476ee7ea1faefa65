"""`python -m svg_lib vmem --sweep | --largest`: the VMEM estimate held against the TPU compiler."""
from __future__ import annotations

import argparse

from svg_lib.cli.common import Command, UsageError, add_json_argument, write_json
from svg_lib.environment import INSTALL_HINT, has_libtpu
from svg_lib.memory.vmem import SPLASH_METHODS
from svg_lib.instruments.tpu.checks import largest_block_q, verify_against_compiler


def _vmem_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", action="store_true", help="estimate against compiler on a grid of blocks")
    parser.add_argument("--largest", action="store_true",
                        help="the largest block_q at block_kv 1536 per method and target (slow: a bisection)")
    parser.add_argument("--methods", nargs="+", default=["dense", "b1", "b2", "b3", "splash_dense", "splash"])
    parser.add_argument("--targets", nargs="+", default=["v6e", "v5e"])
    parser.add_argument("--blocks", nargs="+", default=["512x512", "1024x512", "2048x1536"],
                        help="block_q x block_kv pairs")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--block-kv-compute", nargs="+", type=int, default=None)
    add_json_argument(parser, "write the results as JSON to PATH")


def _vmem_run(args: argparse.Namespace) -> int:
    if not (args.sweep or args.largest):
        raise UsageError("say --sweep or --largest")
    if not has_libtpu():
        raise UsageError("the TPU compiler (libtpu) is not installed. Install it with: " + INSTALL_HINT)
    rows, bad = [], []
    if args.sweep:
        try:
            blocks = [tuple(int(x) for x in b.split("x")) for b in args.blocks]
        except ValueError:
            raise UsageError(f"--blocks takes pairs like 1024x512, got {' '.join(args.blocks)}") from None
        checks = verify_against_compiler(args.methods, blocks, args.dtypes, args.targets,
                                         block_kv_computes=args.block_kv_compute or (None,), log=print)
        rows += [c.row() for c in checks]
        bad = [c for c in checks if not c.agrees]
        print(f"{len(checks)} points, {len(bad)} disagreements, "
              f"{sum(c.conservative for c in checks)} where the estimate is conservative")
    if args.largest:
        for target in args.targets:
            for method in args.methods:
                rows.append(largest_block_q(method, target, splash_mask="blocks" if method in SPLASH_METHODS else None,
                                            log=print))
    if args.json:
        write_json(args.json, rows)
    return 1 if bad else 0


COMMAND = Command("vmem", "the VMEM estimate against the TPU compiler (libtpu, compile-only): --sweep or --largest",
                  _vmem_arguments, _vmem_run)
