"""`python -m svg_lib tune`: time one method over tile sizes."""
from __future__ import annotations

import argparse

from svg_lib.chips import TARGETS, check_target
from svg_lib.cli.common import (
    PROG,
    Command,
    UsageError,
    add_json_argument,
    add_problem_arguments,
    block_sizes,
    emit_json,
    problem_values,
    say,
    show,
)
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import LANES
from svg_lib.environment import INSTALL_HINT, has_libtpu
from svg_lib.problem import BenchConfig
from svg_lib.runtime import detect_runtime
from svg_lib.instruments.tools.bench import INTERPRET_WORK_LIMIT
from svg_lib.instruments.tools.tuner import TUNE_METHODS, check_candidates, default_candidates, tune


def _tune_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser, blocks=False)  # tune takes lists of block sizes instead
    parser.add_argument("--method", default="b2", choices=TUNE_METHODS, help="the method to tune (default b2)")
    parser.add_argument("--block-q", type=block_sizes, metavar="BQ,...",
                        help="query tile sizes to try, multiples of 128 (default: a grid scaled to the problem)")
    parser.add_argument("--block-kv", type=block_sizes, metavar="BKV,...",
                        help="key/value tile sizes to try (every pair with --block-q is tried)")
    parser.add_argument("--repeats", type=int, default=3, metavar="N", help="timed calls per candidate (default 3)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls first (default 1)")
    parser.add_argument("--no-cache", action="store_true", help="measure again even when a cached result exists")
    parser.add_argument("--target", metavar="NAME",
                        help=f"also compile each candidate for this TPU ({', '.join(TARGETS)}) with libtpu and "
                             "drop those the compiler refuses")
    add_json_argument(parser, "also write the result (every candidate timed) as JSON to PATH")
    parser.add_argument("--force", action="store_true",
                        help="run even when interpret mode would take hours (e.g. --preset blog on a CPU)")


def _candidates(args: argparse.Namespace, config: BenchConfig, mask) -> list[tuple[int, int]] | None:
    """The (block_q, block_kv) pairs the flags ask for (None: the tuner's default grid). A pair that
    cannot run here (larger than the problem, or over the VMEM budget) is refused now, in one line:
    the user asked for it, so it is not left to a note after minutes of timing the others."""
    if not (args.block_q or args.block_kv):
        return None
    default = default_candidates(mask.tokens)
    bqs = args.block_q or sorted({c[0] for c in default})
    bkvs = args.block_kv or sorted({c[1] for c in default})
    candidates = [(bq, bkv) for bq in bqs for bkv in bkvs]
    _, rejected = check_candidates(candidates, tokens=mask.tokens, head_dim=config.head_dim, method=args.method,
                                   dtype=config.dtype, generation=args.target)
    if rejected:
        r = rejected[0]
        more = f" (and {len(rejected) - 1} more of the pairs)" if len(rejected) > 1 else ""
        raise UsageError(f"--block-q {r['block_q']} with --block-kv {r['block_kv']} cannot run{more}: {r['reason']}; "
                         "every --block-q is tried with every --block-kv, so give only sizes that fit")
    return candidates


def _tune_run(args: argparse.Namespace) -> int:
    values = problem_values(args, ("frames", "height", "width", "text_tokens", "heads", "head_dim", "density",
                                   "dtype"))
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    try:
        geometry = VideoGeometry(values["frames"], values["height"], values["width"], values["text_tokens"])
        # the blocks are the candidates': one lane's worth stands in so the config is complete
        config = BenchConfig(geometry, values["heads"], values["head_dim"], values["density"], LANES, LANES,
                             dtype=values["dtype"], first_frame_sink=not args.no_sink)
        mask = config.mask()
    except (TypeError, ValueError) as err:
        raise UsageError(f"{err} (check the flags)") from None

    if args.target is not None:
        try:
            check_target(args.target)
        except ValueError as err:
            raise UsageError(f"--target: {err}") from None
        if not has_libtpu():
            raise UsageError("--target needs the TPU compiler (libtpu), which is not installed. Install it with: "
                             + INSTALL_HINT)
    candidates = _candidates(args, config, mask)
    runtime = detect_runtime()
    work = config.heads * float(config.tokens) ** 2
    if not runtime.compiled and work > INTERPRET_WORK_LIMIT and not args.force:
        raise UsageError(f"{config.tokens:,} tokens x {config.heads} heads in interpret mode on {runtime.platform} "
                         f"would take hours per candidate. Try `{PROG} tune --preset small`; --force runs it anyway")
    say(f"tune: {config.geometry}, {config.heads} heads x {config.head_dim}, {config.dtype}, density "
        f"{config.density}; method {args.method}")
    result = tune(config, method=args.method, candidates=candidates, repeats=args.repeats, warmup=args.warmup,
                  cache=not args.no_cache, progress=True, target=args.target)
    show(args, result.table())
    if result.from_cache:
        say(f"(from cache: {result.cache_path}; --no-cache measures again)")
    emit_json(args, result.to_json())
    return 0 if result.rows else 1


COMMAND = Command("tune", "time one method over tile sizes (block_q x block_kv) and report the fastest",
            _tune_arguments, _tune_run)
