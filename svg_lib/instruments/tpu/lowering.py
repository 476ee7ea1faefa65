"""Lower the attention kernels for TPU on any machine, and say whether they would fit.

`jax.export.export(fn, platforms=["tpu"])` runs the Pallas -> Mosaic lowering on the host,
so a CPU-only machine can check a kernel at the blog's size: block shapes, unsupported
ops and scalar-prefetch tables all have to pass. What it cannot check is VMEM (Mosaic
only allocates it when compiling on a TPU), so each report carries the estimate of
`svg_lib.memory.vmem` beside the budget of the TPU generation planned for (the attached one, or
a v6e when there is none). `build_attention` refuses blocks that overflow; that refusal
is reported as a failed lowering, like any error raised on the way.

    python -m svg_lib lower --preset blog            # one line per method; exit 1 if any failed
    python -m svg_lib lower --preset blog --json out.json

jax is imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from svg_lib.attention import build_attention
from svg_lib.memory.smem import SmemOverflowError
from svg_lib.memory.vmem import estimate_vmem
from svg_lib.problem import PALLAS_METHODS, BenchConfig
from svg_lib.instruments.tpu.errors import first_lines

MiB = 2**20


def vmem_text(vmem_bytes, vmem_budget, vmem_fits, vmem_limit_bytes, generation, default_scoped=None) -> str:
    """The VMEM estimate in a few words, for a report line ("VMEM -" when there is none)."""
    if vmem_bytes is None:
        return "VMEM -"
    default = ", default limit" + (f" {default_scoped / MiB:.0f} MiB" if default_scoped else "")
    return (f"VMEM {vmem_bytes / MiB:.1f} MiB of {vmem_budget / MiB:.0f} MiB {generation} budget"
            f"{'' if vmem_fits else ' (OVERFLOWS)'}"
            + (f", limit {vmem_limit_bytes / MiB:.0f} MiB" if vmem_limit_bytes else default))


def check_tpu_arguments(config, method: str, verb: str = "lower") -> None:
    """TypeError / ValueError for arguments no TPU check can take: not a BenchConfig, not a Pallas method."""
    if not isinstance(config, BenchConfig):
        raise TypeError(f"config must be a BenchConfig (e.g. BenchConfig.from_preset('blog')), "
                        f"got {type(config).__name__}")
    if method not in PALLAS_METHODS:
        raise ValueError(f"cannot {verb} {method!r} for TPU: choose a Pallas kernel from "
                         f"{', '.join(PALLAS_METHODS)} ('reference' is plain jax.numpy)")


def check_methods(methods, verb: str = "lower") -> tuple:
    """`methods` as a tuple (a single name is allowed); ValueError naming any that is no Pallas kernel."""
    if isinstance(methods, str):
        methods = (methods,)
    methods = tuple(methods)
    bad = [m for m in methods if m not in PALLAS_METHODS]
    if bad:
        raise ValueError(f"cannot {verb} {', '.join(map(repr, bad))} for TPU: choose Pallas kernels from "
                         f"{', '.join(PALLAS_METHODS)} ('reference' is plain jax.numpy)")
    return methods


def vmem_facts(config: BenchConfig, method: str, generation: str | None = None) -> dict:
    """The VMEM estimate of one kernel of `method`, as report fields (budget of `generation`,
    by default the attached TPU's or a v6e)."""
    vmem = estimate_vmem(method, config.block_q, config.block_kv, config.head_dim, config.dtype,
                         config.block_kv_compute, generation)
    return {"vmem_bytes": vmem.total, "vmem_budget": vmem.budget, "vmem_fits": vmem.fits,
            "vmem_limit_bytes": vmem.vmem_limit_bytes, "generation": vmem.generation}


def build_for_tpu(config: BenchConfig, method: str, generation: str | None = None):
    """`(fn, build_s)`: `method` built for `config` with interpret=False, ready to lower or compile,
    its VMEM planned for `generation` (None: the attached TPU's, or a v6e's).

    Errors propagate (build_attention refuses blocks whose VMEM estimate overflows)."""
    import jax.numpy as jnp

    start = time.perf_counter()
    fn = build_attention(config.mask(), method=method, heads=config.heads, tokens=config.tokens,
                         head_dim=config.head_dim, dtype=jnp.dtype(config.dtype), block_q=config.block_q,
                         block_kv=config.block_kv, block_kv_compute=config.block_kv_compute, interpret=False,
                         generation=generation)
    return fn, time.perf_counter() - start


def build_failure_stage(facts: dict, err: BaseException | None = None) -> str:
    """Where a failed build failed: "vmem" when the VMEM estimate overflows, "smem" when the
    schedule's SMEM estimate does (build_attention refuses both before any compile), else "build"."""
    if not facts["vmem_fits"]:
        return "vmem"
    return "smem" if isinstance(err, SmemOverflowError) else "build"


def splash_note(config: BenchConfig, methods) -> str | None:
    """A line warning that Splash's host-side mask info takes a while at this size, or None."""
    if "splash" in methods and config.tokens > 32_768:
        return "  (splash classifies its blocks on the host: expect tens of seconds at this size)"
    return None


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
        vmem = vmem_text(self.vmem_bytes, self.vmem_budget, self.vmem_fits, self.vmem_limit_bytes,
                         self.generation)
        if self.ok:
            return (f"{self.method:<12} ok      build {self.build_s:6.2f} s  lower {self.lower_s:5.2f} s  "
                    f"{self.custom_calls} tpu_custom_call  {self.module_bytes / 1024:7.1f} KiB  {vmem}")
        where = {"vmem": "VMEM check", "build": "build", "lower": "lowering"}.get(self.stage, self.stage)
        first = (self.error or "").splitlines()[0] if self.error else ""
        tail = "" if self.stage == "vmem" else f"  [{vmem}]"  # a VMEM failure's message has the numbers
        return f"{self.method:<12} FAILED  at {where}: {first}{tail}"

    def to_json(self) -> dict:
        return asdict(self)


def lower_for_tpu(config: BenchConfig, method: str) -> LoweringReport:
    """Build `method` for `config` with interpret=False and lower it to Mosaic for TPU.

    Never raises for a configuration that fails to build, fit or lower: the report says
    so (`ok=False`, `stage`, `error`). Bad arguments (not a BenchConfig, a method that is
    not a Pallas kernel) do raise ValueError / TypeError.
    """
    import jax
    import jax.numpy as jnp
    from jax import export  # `jax.export` is not an attribute of `jax` until imported, before jax 0.8

    check_tpu_arguments(config, method, "lower")
    facts = vmem_facts(config, method)

    def failed(stage, err, build_s=None, lower_s=None):
        return LoweringReport(method, False, first_lines(err), stage, build_s, lower_s, None, None, **facts)

    start = time.perf_counter()
    try:
        fn, build_s = build_for_tpu(config, method)
    except Exception as err:  # a report, not a crash: the caller wants to see every method's outcome
        return failed(build_failure_stage(facts, err), err, build_s=time.perf_counter() - start)

    start = time.perf_counter()
    try:
        args = [jax.ShapeDtypeStruct(config.shape, jnp.dtype(config.dtype))] * 3
        exported = export.export(fn, platforms=["tpu"])(*args)
        text = exported.mlir_module()
    except Exception as err:
        return failed("lower", err, build_s, time.perf_counter() - start)
    lower_s = time.perf_counter() - start
    return LoweringReport(method, True, None, None, build_s, lower_s, len(exported.mlir_module_serialized),
                          text.count("@tpu_custom_call"), **facts)


def lower_all(config: BenchConfig, methods=PALLAS_METHODS, progress=None) -> list[LoweringReport]:
    """`lower_for_tpu` for each method in turn; `progress(report)` is called as each finishes."""
    methods = check_methods(methods, "lower")
    reports = []
    for method in methods:
        report = lower_for_tpu(config, method)
        reports.append(report)
        if progress is not None:
            progress(report)
    return reports
