"""Lower the attention kernels for TPU on any machine, and say whether they would fit.

`jax.export.export(fn, platforms=["tpu"])` runs the Pallas -> Mosaic lowering on the host,
so a CPU-only machine can check a kernel at the blog's size: block shapes, unsupported
ops and scalar-prefetch tables all have to pass. What it cannot check is VMEM (Mosaic
only allocates it when compiling on a TPU), so each report carries the estimate of
`svg_lib.vmem` beside the budget of the TPU generation planned for (the attached one, or
a v6e when there is none). `build_attention` refuses blocks that overflow; that refusal
is reported as a failed lowering, like any error raised on the way.

    python -m svg_lib lower --preset blog            # one line per method; exit 1 if any failed
    python -m svg_lib lower --preset blog --json out.json

jax is imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass

from .bench import PALLAS_METHODS, BenchConfig, add_config_arguments, config_from_args, methods_from_args, write_json

MiB = 2**20
_ERROR_LINES = 4  # Mosaic errors can run to pages of IR; the first lines say what went wrong


@dataclass(frozen=True)
class LoweringReport:
    """The outcome of lowering one method of one problem for TPU."""

    method: str
    ok: bool
    error: str | None          # the exception's type and first lines, when not ok
    stage: str | None          # where it failed: "vmem" (the estimate), "build" or "lower"; None when ok
    build_s: float | None      # build_attention: planning, Splash's mask info
    lower_s: float | None      # jax.export to Mosaic
    module_bytes: int | None   # size of the serialized StableHLO module (kernel bodies included)
    custom_calls: int | None   # tpu_custom_call ops in the module: one per Pallas kernel
    vmem_bytes: int | None     # estimated VMEM of one kernel instance
    vmem_budget: int | None    # what the estimate is held against (capacity x headroom)
    vmem_fits: bool | None
    vmem_limit_bytes: int | None  # what the kernel asks Mosaic for; None: the default scoped limit
    generation: str | None     # the TPU generation the VMEM budget is for

    def line(self) -> str:
        """One line for the terminal."""
        vmem = "VMEM -" if self.vmem_bytes is None else (
            f"VMEM {self.vmem_bytes / MiB:.1f} MiB of {self.vmem_budget / MiB:.0f} MiB {self.generation} budget"
            f"{'' if self.vmem_fits else ' (OVERFLOWS)'}"
            + (f", limit {self.vmem_limit_bytes / MiB:.0f} MiB" if self.vmem_limit_bytes else ", default limit"))
        if self.ok:
            return (f"{self.method:<12} ok      build {self.build_s:6.2f} s  lower {self.lower_s:5.2f} s  "
                    f"{self.custom_calls} tpu_custom_call  {self.module_bytes / 1024:7.1f} KiB  {vmem}")
        where = {"vmem": "VMEM check", "build": "build", "lower": "lowering"}.get(self.stage, self.stage)
        first = (self.error or "").splitlines()[0] if self.error else ""
        tail = "" if self.stage == "vmem" else f"  [{vmem}]"  # a VMEM failure's message has the numbers
        return f"{self.method:<12} FAILED  at {where}: {first}{tail}"

    def to_json(self) -> dict:
        return asdict(self)


def _first_lines(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return "\n".join(text.splitlines()[:_ERROR_LINES])


def lower_for_tpu(config: BenchConfig, method: str) -> LoweringReport:
    """Build `method` for `config` with interpret=False and lower it to Mosaic for TPU.

    Never raises for a configuration that fails to build, fit or lower: the report says
    so (`ok=False`, `stage`, `error`). Bad arguments (not a BenchConfig, a method that is
    not a Pallas kernel) do raise ValueError / TypeError.
    """
    import jax
    import jax.numpy as jnp

    from .attention import build_attention
    from .vmem import estimate_vmem

    if not isinstance(config, BenchConfig):
        raise TypeError(f"config must be a BenchConfig (e.g. BenchConfig.from_preset('blog')), "
                        f"got {type(config).__name__}")
    if method not in PALLAS_METHODS:
        raise ValueError(f"cannot lower {method!r} for TPU: choose a Pallas kernel from "
                         f"{', '.join(PALLAS_METHODS)} ('reference' is plain jax.numpy)")

    vmem = estimate_vmem(method, config.block_q, config.block_kv, config.head_dim, config.dtype,
                         config.block_kv_compute)
    facts = {"vmem_bytes": vmem.total, "vmem_budget": vmem.budget, "vmem_fits": vmem.fits,
             "vmem_limit_bytes": vmem.vmem_limit_bytes, "generation": vmem.generation}

    def failed(stage, err, build_s=None, lower_s=None):
        return LoweringReport(method, False, _first_lines(err), stage, build_s, lower_s, None, None, **facts)

    dtype = jnp.dtype(config.dtype)
    start = time.perf_counter()
    try:
        fn = build_attention(config.mask(), method=method, heads=config.heads, tokens=config.tokens,
                             head_dim=config.head_dim, dtype=dtype, block_q=config.block_q,
                             block_kv=config.block_kv, block_kv_compute=config.block_kv_compute, interpret=False)
    except Exception as err:  # a report, not a crash: the caller wants to see every method's outcome
        stage = "vmem" if not vmem.fits else "build"
        return failed(stage, err, build_s=time.perf_counter() - start)
    build_s = time.perf_counter() - start

    start = time.perf_counter()
    try:
        args = [jax.ShapeDtypeStruct(config.shape, dtype)] * 3
        exported = jax.export.export(fn, platforms=["tpu"])(*args)
        text = exported.mlir_module()
    except Exception as err:
        return failed("lower", err, build_s, time.perf_counter() - start)
    lower_s = time.perf_counter() - start
    return LoweringReport(method, True, None, None, build_s, lower_s, len(exported.mlir_module_serialized),
                          text.count("@tpu_custom_call"), **facts)


def lower_all(config: BenchConfig, methods=PALLAS_METHODS, progress=None) -> list[LoweringReport]:
    """`lower_for_tpu` for each method in turn; `progress(report)` is called as each finishes."""
    if isinstance(methods, str):
        methods = (methods,)
    bad = [m for m in methods if m not in PALLAS_METHODS]
    if bad:
        raise ValueError(f"cannot lower {', '.join(map(repr, bad))}; choose from {', '.join(PALLAS_METHODS)}")
    reports = []
    for method in methods:
        report = lower_for_tpu(config, method)
        reports.append(report)
        if progress is not None:
            progress(report)
    return reports


# -- command line ----------------------------------------------------------------------------

def _lower_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON to PATH")


def _lower_run(args: argparse.Namespace) -> int:
    import jax

    from .runtime import detect_runtime

    config = config_from_args(args)
    methods = methods_from_args(args, default=PALLAS_METHODS)
    if "reference" in methods:
        from .cli import UsageError
        raise UsageError(f"--methods: 'reference' is plain jax.numpy, nothing to lower for TPU; "
                         f"choose from {', '.join(PALLAS_METHODS)}")
    runtime = detect_runtime()
    print(f"lower for TPU (jax.export, platforms=['tpu']) on {runtime.platform} ({runtime.device_kind}), "
          f"jax {jax.__version__}: {config.describe()}", flush=True)
    if "splash" in methods and config.tokens > 32_768:
        print("  (splash classifies its blocks on the host: expect tens of seconds at this size)", flush=True)
    reports = lower_all(config, methods, progress=lambda r: print(r.line(), flush=True))
    failed = [r.method for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} lowered"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + ". Lowering checks block shapes and ops; VMEM is the estimate above, not a compile.", flush=True)
    if args.json:
        write_json(args.json, {"config": config.to_json(), "runtime": asdict(runtime),
                               "reports": [r.to_json() for r in reports]})
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


def _command():
    from .cli import Command
    return Command("lower", "lower the Pallas kernels for TPU with jax.export (works on a CPU) and check VMEM",
                   _lower_arguments, _lower_run)


COMMAND = _command()
