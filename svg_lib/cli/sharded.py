"""`python -m svg_lib sharded`: the sharded SVG layer compiled for a TPU slice (libtpu, compile-only).

Defaults to the case study's per-layer size on "v6e:2x4", both placements (a few minutes on a
2-core CPU: each compile takes 30 to 60 s of CPU time).
"""
from __future__ import annotations

import argparse
import dataclasses

from svg_lib.chips import check_topology
from svg_lib.cli.common import (
    Command,
    UsageError,
    add_json_argument,
    add_preset_argument,
    argument_type,
    block_size,
    emit_json,
    positive_int,
    say,
)
from svg_lib.environment import INSTALL_HINT, has_libtpu
from svg_lib.layers.multichip import PLACEMENTS
from svg_lib.methods import PLANNED_METHODS
from svg_lib.problem import get_preset
from svg_lib.progress import bar, write
from svg_lib.instruments.tpu.sharded import compile_sharded_layer


def _sharded_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--permute", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS),
                        help=f"where the tokens are permuted, one compile each (default: {' '.join(PLACEMENTS)})")
    add_preset_argument(parser, "blog", note="; its mask, head dim, dtype and tiles")
    parser.add_argument("--heads", type=positive_int, default=40,
                        help="heads of the layer, split over the chips (default 40)")
    parser.add_argument("--method", default="b3", choices=PLANNED_METHODS)
    parser.add_argument("--block-q", type=block_size, default=None, help="default: the preset's")
    parser.add_argument("--block-kv", type=block_size, default=None, help="default: the preset's")
    parser.add_argument("--topology", default="v6e:2x4", type=argument_type(check_topology, "topology"),
                        help="the TPU slice: a generation and its chips per axis (default v6e:2x4, 8 chips)")
    add_json_argument(parser, "also write the reports as JSON to PATH")


def _sharded_run(args: argparse.Namespace) -> int:
    import jax  # only for its version in the JSON

    if not has_libtpu():
        raise UsageError("the TPU compiler (libtpu) is not installed. Install it with: " + INSTALL_HINT)
    preset = get_preset(args.preset)
    reports = []
    say(f"sharded: {len(args.permute)} compile(s) of the {args.method} layer for {args.topology} on this CPU, "
        "30 to 60 s of CPU time each; each result prints as it comes")
    shown = bar(total=len(args.permute), desc="sharded", unit="compile")
    for permute in args.permute:
        shown.set_description(f"sharded: permute {permute}")
        report = compile_sharded_layer(preset.mask(), permute=permute, heads=args.heads, head_dim=preset.head_dim,
                                       dtype=preset.dtype, method=args.method,
                                       block_q=args.block_q or preset.block_q, block_kv=args.block_kv or preset.block_kv,
                                       topology=args.topology)
        write(report.describe())
        reports.append(report)
        shown.update(1)
    shown.close()
    if args.json:
        rows = []
        for r in reports:
            row = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "compiled"}
            row["collectives"] = {k: dataclasses.asdict(c) for k, c in r.collectives.items()}
            row["evidence"] = r.evidence
            row["jax"] = jax.__version__
            rows.append(row)
        emit_json(args, rows)
    return 0


COMMAND = Command("sharded", "compile the sharded SVG layer for a TPU slice with libtpu and report its "
                  "collectives and per-chip memory (nothing runs)", _sharded_arguments, _sharded_run)
