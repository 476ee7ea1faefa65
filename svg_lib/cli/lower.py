"""`python -m svg_lib lower`: lower the kernels for TPU with jax.export."""
from __future__ import annotations

import argparse
from dataclasses import asdict

from svg_lib.cli.common import (
    Command,
    UsageError,
    add_config_arguments,
    add_json_argument,
    config_from_args,
    emit_json,
    methods_from_args,
)
from svg_lib.problem import PALLAS_METHODS
from svg_lib.runtime import detect_runtime
from svg_lib.instruments.tpu.lowering import lower_all, splash_note

# -- command line ----------------------------------------------------------------------------

def _lower_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    add_json_argument(parser, "also write the reports as JSON to PATH")


def _lower_run(args: argparse.Namespace) -> int:
    import jax

    config = config_from_args(args)
    methods = methods_from_args(args, default=PALLAS_METHODS)
    if "reference" in methods:
        raise UsageError(f"--methods: 'reference' is plain jax.numpy, nothing to lower for TPU; "
                         f"choose from {', '.join(PALLAS_METHODS)}")
    runtime = detect_runtime()
    print(f"lower for TPU (jax.export, platforms=['tpu']) on {runtime.platform} ({runtime.device_kind}), "
          f"jax {jax.__version__}: {config.describe()}", flush=True)
    if splash_note(config, methods):
        print(splash_note(config, methods), flush=True)
    reports = lower_all(config, methods, progress=lambda r: print(r.line(), flush=True))
    failed = [r.method for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} lowered"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + ". Lowering checks block shapes and ops; VMEM is the estimate above, not a compile.", flush=True)
    emit_json(args, {"config": config.to_json(), "runtime": asdict(runtime),
                     "reports": [r.to_json() for r in reports]})
    return 1 if failed else 0


COMMAND = Command("lower", "lower the Pallas kernels for TPU with jax.export (works on a CPU) and check VMEM",
            _lower_arguments, _lower_run)
