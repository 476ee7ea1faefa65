"""`python -m svg_lib bench`: time the attention methods on one problem."""
from __future__ import annotations

import argparse

from svg_lib.cli.common import (
    PROG,
    Command,
    UsageError,
    add_config_arguments,
    add_json_argument,
    config_from_args,
    emit_json,
    methods_from_args,
    say,
    show,
)
from svg_lib.runtime import detect_runtime
from svg_lib.instruments.tools.bench import INTERPRET_WORK_LIMIT, run_benchmark


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, metavar="N", help="timed calls per method (default 3)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls first (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random q, k, v (default 0)")
    parser.add_argument("--no-check", action="store_true", help="skip the error check against the reference")
    add_json_argument(parser, "also write the result (every row of the table) as JSON to PATH")
    parser.add_argument("--backward", action="store_true",
                        help="also time forward + backward (jax.grad for q, k, v) and check the gradients")
    parser.add_argument("--force", action="store_true",
                        help="run even when interpret mode would take hours (e.g. --preset blog on a CPU)")


def _bench_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    methods = methods_from_args(args)
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    runtime = detect_runtime()
    work = config.heads * float(config.tokens) ** 2
    if not runtime.compiled and work > INTERPRET_WORK_LIMIT and not args.force:
        small = 2 * 10_080.0 ** 2
        raise UsageError(
            f"{config.tokens:,} tokens x {config.heads} heads in interpret mode on {runtime.platform} would take "
            f"hours ({work / small:.0f}x the work of --preset small). Try `{PROG} bench --preset small`, or check "
            f"that the kernels lower for TPU with `{PROG} lower --preset blog`; --force runs it anyway")

    say(f"bench: {config.describe()}; methods {', '.join(methods)}")
    result = run_benchmark(config, methods, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                           check_error=not args.no_check, progress=say, backward=args.backward)
    show(args, result.table())
    emit_json(args, result.to_json())
    return 0


COMMAND = Command("bench", "time the attention methods on one problem, beside the blog's v6e figures",
            _bench_arguments, _bench_run)
