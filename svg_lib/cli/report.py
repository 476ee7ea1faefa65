"""`python -m svg_lib report`: the page a reader with a TPU runs and shares (svg_lib.instruments.tools.report)."""
from __future__ import annotations

import argparse
import sys

from svg_lib.cli.common import (OUTPUT_NOTE, Command, UsageError, add_json_argument, add_preset_argument, create_folder,
                                emit_json, output_folder)
from svg_lib.problem import PRESETS
from svg_lib.progress import is_quiet, write
from svg_lib.instruments.tools.report import default_config, issues_url, run_report


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="svg_lib_report", metavar="DIR", type=output_folder,
                        help=f"folder for report.json, report.md and report.png (default svg_lib_report){OUTPUT_NOTE}")
    add_preset_argument(parser, note="default: blog on a TPU, walkthrough elsewhere, where the kernels interpret",
                        overrides=False)
    parser.add_argument("--repeats", type=int, default=5, metavar="N", help="timed calls per stage (default 5)")
    add_json_argument(parser, "also write report.json's content to PATH")


def _report_run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    config = PRESETS[args.preset] if args.preset else default_config()
    data = run_report(create_folder(args.out), config=config, repeats=args.repeats, bar=True,
                      command=args._command_line, progress=lambda line: is_quiet() or write(line, sys.stderr))
    print(f"{data['evidence']}: wrote {args.out}/report.md, report.json and report.png; send all three to "
          f"{issues_url()}")
    emit_json(args, data)
    return 0


COMMAND = Command("report", "time B0-B3, run the adversarial inputs and the bound's pass rate, beside the "
                  "static profile's cycles: one page to share", _report_arguments, _report_run)
