"""The real TPU compiler, run on this machine's CPU: compile for a TPU that is not attached.

The `libtpu` wheel holds the whole TPU compiler. JAX can hand it a *compile-only* device of
a named topology (`jax.experimental.topologies.get_topology_desc`), and `jax.jit(f).lower(
...).compile()` then compiles for that chip exactly as it would on a TPU VM: Mosaic kernels
included, VMEM and SMEM allocated and checked, nothing run. This is the strongest TPU
evidence the series has without a TPU (stronger than `jax.export` lowering, which stops
before any memory is allocated); it is still not a measurement of speed.

    from svg_lib.compiler import compile_only_device, compile_fn
    device = compile_only_device("v6e")
    compiled, seconds = compile_fn(f, [((10, 75_600, 128), "bfloat16")] * 3, target="v6e")
    compiled.memory_analysis()

Installing libtpu changes nothing for a CPU reader: `jax.devices()` still returns the CPU
and kernels still run in interpret mode. libtpu is needed only for what this module does;
without it, `require_libtpu()` raises with the pip command that installs it.

jax is imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import os
import re
import sys
import time
from dataclasses import asdict, dataclass

MiB = 2**20
KiB = 2**10

INSTALL_HINT = ('pip install -e ".[tpu-compile]"  (from the repository root; `make lab` and '
                "`make test` install it). It pins libtpu to the version the installed jax expects.")


@dataclass(frozen=True)
class TpuTarget:
    """One TPU generation the compiler can build for, with the facts the series uses.

    Memory figures are per TensorCore, as the compiler enforces them.
    """

    name: str              # the series' name for it: "v6e", "v5e", ...
    topology: str          # single-chip topology name get_topology_desc accepts
    device_kind: str       # what jax reports for that chip ("TPU v6 lite")
    vmem_bytes: int        # VMEM per TensorCore
    default_scoped_vmem: int  # a kernel's VMEM limit unless it asks for more (vmem_limit_bytes)
    smem_bytes: int        # SMEM per TensorCore: where scalar-prefetched tables live
    mxu: int               # MXU side: 128 x 128 before v6, 256 x 256 from v6
    mxus_per_core: int
    tensor_cores: int      # TensorCores per chip (a v4 / v5p "megacore" chip shows as one device)
    bf16_tflops: float     # peak bf16 TFLOP/s per chip (public spec sheets)
    hbm_gbps: float        # HBM bandwidth per chip, GB/s (public spec sheets)

    @property
    def describe(self) -> str:
        return (f"{self.name} ({self.device_kind}): VMEM {self.vmem_bytes // MiB} MiB "
                f"(default scoped {self.default_scoped_vmem // MiB} MiB), SMEM {self.smem_bytes // KiB} KiB, "
                f"{self.mxus_per_core} x {self.mxu}x{self.mxu} MXU per core")


# Single-chip topology names accepted by libtpu 0.0.42 with chips_per_host_bounds=(1, 1, 1).
# ("v5litepod-1" and "v7x:..." are refused; the v7x is named "tpu7x" there.) Memory, MXU and
# per-core figures agree with jax's own table (pltpu.get_tpu_info_for_chip, jax 0.10.2).
# A v7x chip holds two TensorCores that jax shows as two devices ("TPU7x"); its row gives
# per-chip peak figures (twice the per-core ones of jax's table), like the other rows. Its
# default scoped VMEM (32 MiB) is svg_lib.vmem's figure, not one measured here.
TARGETS: dict[str, TpuTarget] = {t.name: t for t in (
    TpuTarget("v4", "v4:1x1x1", "TPU v4", 16 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 275.0, 1200.0),
    TpuTarget("v5e", "v5e:1x1", "TPU v5 lite", 128 * MiB, 16 * MiB, 1 * MiB, 128, 4, 1, 197.0, 819.0),
    TpuTarget("v5p", "v5p:1x1x1", "TPU v5", 64 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 459.0, 2765.0),
    TpuTarget("v6e", "v6e:1x1", "TPU v6 lite", 128 * MiB, 32 * MiB, 1 * MiB, 256, 2, 1, 918.0, 1640.0),
    TpuTarget("v7x", "tpu7x:1x1x1", "TPU7x", 64 * MiB, 32 * MiB, 1 * MiB, 256, 2, 2, 2310.0, 7400.0),
)}
DEFAULT_TARGET = "v6e"  # the case study's chip


def check_target(target: str) -> TpuTarget:
    """The TpuTarget named `target` ("v6e", ...), or a ValueError listing the known ones."""
    if isinstance(target, TpuTarget):
        return target
    try:
        return TARGETS[target]
    except (KeyError, TypeError):
        raise ValueError(f"unknown TPU target {target!r}; the compiler can build for "
                         f"{', '.join(TARGETS)}") from None


def has_libtpu() -> bool:
    """True when the libtpu wheel (the TPU compiler) is installed."""
    import importlib.util
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Raise a RuntimeError that says how to install libtpu, if it is missing."""
    if not has_libtpu():
        raise RuntimeError("compiling for TPU on this machine needs the TPU compiler from the libtpu "
                           f"wheel, which is not installed. Install it with: {INSTALL_HINT}")


def allow_shared_libtpu() -> None:
    """Let several processes load libtpu when no TPU is attached (called by `import svg_lib`).

    Must run before jax first initialises its backends in a process, hence at import."""
    # libtpu takes a lock file so that two processes never drive the same TPU chips. With no
    # TPU attached there are no chips to protect, and the lock would only stop a second
    # process (a notebook kernel beside a test run) from compiling. On a TPU host (device
    # files present) the lock stays.
    if not glob.glob("/dev/accel*") and not os.path.isdir("/dev/vfio"):
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # Without these, libtpu's start-up (when jax first looks for devices) prints several
        # lines of warnings about the TPU slice it cannot find, into every notebook's output.
        # With no TPU attached they name nothing real: jax still falls back to the CPU, and a
        # compile-only topology names its own generation (same compiler verdicts either way).
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")



@functools.lru_cache(maxsize=None)
def compile_only_topology(target: str = DEFAULT_TARGET, topology: str | None = None):
    """jax's TopologyDescription for `target` (single chip), or for an explicit topology name
    such as "v6e:2x4" (an 8-chip slice), without any TPU attached."""
    require_libtpu()
    from jax.experimental import topologies

    spec = check_target(target)
    return topologies.get_topology_desc(platform="tpu", topology_name=topology or spec.topology,
                                        chips_per_host_bounds=(1, 1, 1))


def compile_only_device(target: str = DEFAULT_TARGET):
    """A compile-only jax Device of one `target` chip: give it to ShapeDtypeStruct shardings."""
    return compile_only_topology(target).devices[0]


def shape_structs(shapes, target: str = DEFAULT_TARGET):
    """`[(shape, dtype), ...]` -> ShapeDtypeStructs placed on `target`'s compile-only device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(compile_only_device(target))
    return [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding) for shape, dtype in shapes]


def compile_fn(fn, shapes, target: str = DEFAULT_TARGET):
    """Compile `fn(*args)` for `target` with args of `shapes` `[(shape, dtype), ...]`.

    Returns `(compiled, seconds)`; the compiler's errors (a VMEM or SMEM overflow, an
    unsupported op) propagate as they are: see `classify_error`.
    """
    args = shape_structs(shapes, target)
    start = time.perf_counter()
    compiled = compile_placed(fn, args)
    return compiled, time.perf_counter() - start


# Whether Mosaic kernels must reach this libtpu through jax.export (see compile_placed); learnt
# from the first refusal, so that a process pays for it once.
_MOSAIC_THROUGH_EXPORT = False
_MOSAIC_VERSION_REFUSED = re.compile(r"Unsupported version: expected <= (\d+) but got (\d+)")


def compile_placed(fn, args):
    """`jax.jit(fn).lower(*args).compile()` for args already placed on compile-only TPU devices.

    One difference from that line: a libtpu older than the installed jax may refuse the Mosaic
    serialization version jax writes. jax picks an older version itself when it can see the TPU's
    build date, which a compile-only device does not show (Colab's jax 0.7.2 writes version 8 there,
    its libtpu 0.0.21.1 reads up to 7). Exported programs (`jax.export`) are always serialized in
    the forward-compatible version, so on that refusal the program is exported and the export
    compiled instead: the same kernels, the older serialization.
    """
    global _MOSAIC_THROUGH_EXPORT
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    with _compile_only_layouts():
        if not _MOSAIC_THROUGH_EXPORT:
            try:
                return jitted.lower(*args).compile()
            except Exception as err:
                if not _MOSAIC_VERSION_REFUSED.search(str(err)):
                    raise
                _MOSAIC_THROUGH_EXPORT = True
        return _compile_exported(jitted, args)


@contextlib.contextmanager
def _compile_only_layouts():
    """Let jax before 0.8 finish a compile-only compile without crashing.

    After compiling, jax 0.7 asks the device's client for each argument's default layout, and with
    Colab's jax 0.7.2 and libtpu 0.0.21.1 that call on a compile-only client ends the process with
    a segmentation fault. The answer only decides how arguments are passed when the executable is
    called, and a compile-only executable is never called: on that jax, every layout is taken as
    the default while compiling. Newer jax neither crashes nor is touched.
    """
    import jax

    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 8):
        yield
        return
    from jax._src.interpreters import pxla  # private: the one function that crashes, nothing else

    original = pxla.is_default_layout
    pxla.is_default_layout = lambda layout, sharding, aval: True
    try:
        yield
    finally:
        pxla.is_default_layout = original


def _compile_exported(jitted, args):
    import jax
    from jax import export  # before jax 0.8, `jax.export` is reachable only once imported

    # exported from shapes with their shardings but no layouts: asking a compile-only device for
    # its layouts crashes jax 0.7.2
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)) for a in args]
    exported = export.export(jitted, platforms=["tpu"])(*shapes)
    return jax.jit(exported.call).lower(*args).compile()


def mosaic_through_export() -> bool:
    """True once this process compiles Mosaic kernels through jax.export (see compile_placed)."""
    return _MOSAIC_THROUGH_EXPORT


_OOM = re.compile(r"(CompileTimeScopedVmemOom|Ran out of memory in memory space (\w+)|"
                  r"Scoped allocation with size ([\d.]+\w?) and limit ([\d.]+\w?))")


def classify_error(err: BaseException) -> str:
    """"vmem", "smem" or "compile": what kind of refusal a compiler error is."""
    text = str(err)
    if "CompileTimeScopedVmemOom" in text or "memory space vmem" in text:
        return "vmem"
    if "memory space smem" in text:
        return "smem"
    return "compile"


def first_lines(err: BaseException, lines: int = 4) -> str:
    """The exception's type and its first few lines: compiler messages can run to pages."""
    text = f"{type(err).__name__}: {err}".strip()
    keep = [line for line in text.splitlines() if line.strip()]
    return "\n".join(keep[:lines])


def refusal_summary(err: BaseException) -> str:
    """One line that says why the compiler refused: the memory overflow's numbers when it is
    one (they sit deep in a long message), else the message's first line."""
    text = str(err)
    scoped = re.search(r"Scoped allocation with size ([\d.]+\w?) and limit ([\d.]+\w?)", text)
    if scoped:
        return f"VMEM overflow: a scoped allocation of {scoped.group(1)} exceeds the limit {scoped.group(2)}"
    used = re.search(r"Ran out of memory in memory space (\w+)\. Used ([\d.]+\w?) of ([\d.]+\w?)", text)
    if used:
        return f"{used.group(1).upper()} overflow: {used.group(2)} used of {used.group(3)}"
    return first_lines(err, 1)


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None without it."""
    from ._environment import installed_version

    return installed_version("libtpu")


def targets_table() -> str:
    """The TARGETS table as fixed-width text: memory, MXU and peak figures per generation."""
    cols = [("target", 6, "<"), ("topology", 12, "<"), ("device kind", 12, "<"), ("VMEM", 8, ">"),
            ("scoped", 7, ">"), ("SMEM", 8, ">"), ("MXU", 9, ">"), ("cores", 5, ">"), ("bf16 TF/s", 9, ">"),
            ("HBM GB/s", 8, ">")]
    rows = [[t.name, t.topology, t.device_kind, f"{t.vmem_bytes // MiB} MiB", f"{t.default_scoped_vmem // MiB} MiB",
             f"{t.smem_bytes // KiB} KiB", f"{t.mxus_per_core} x {t.mxu}", str(t.tensor_cores),
             f"{t.bf16_tflops:.0f}", f"{t.hbm_gbps:.0f}"] for t in TARGETS.values()]

    def fmt(cells):
        return "  ".join(f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, cols))

    head = fmt([c[0] for c in cols])
    lines = [head, "-" * len(head)] + [fmt(r) for r in rows]
    lines.append("VMEM, SMEM and MXUs per TensorCore (what one kernel sees; scoped: a kernel's VMEM limit unless "
                 "it asks for more); cores, bf16 peak and HBM bandwidth per chip.")
    return "\n".join(lines)


# -- compiling the attention kernels: a report per method and target --------------------------

@dataclass(frozen=True)
class CompileReport:
    """The outcome of compiling one method of one problem for one TPU generation (nothing runs).

    `stage` says where a failure happened: "vmem" (the VMEM estimate refused, or the compiler
    ran out of VMEM), "smem" (the compiler ran out of SMEM: scalar-prefetched tables), "build"
    (build_attention raised) or "compile" (any other compiler error); `refused_by` says whose
    verdict it is: "estimate", "build" or "compiler". Memory figures come from the compiled
    executable's memory_analysis (HBM buffers of the whole program); VMEM is only checked by
    the compiler, never reported by it, so the estimate stands beside them.
    """

    method: str
    target: str
    block_q: int
    block_kv: int
    block_kv_compute: int      # the inner key chunk the kernel was built with (the default when not given)
    ok: bool
    stage: str | None          # None when ok
    refused_by: str | None     # "estimate", "build" or "compiler"; None when ok
    error: str | None          # the first lines of the message, when not ok
    summary: str | None        # one line: why it was refused
    build_s: float | None      # build_attention: planning, Splash's mask info (shared across targets)
    compile_s: float | None    # lowering + the TPU compiler
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    code_bytes: int | None     # generated code
    vmem_bytes: int | None     # the estimate for one kernel instance
    vmem_budget: int | None    # the estimate's budget on this target (capacity x headroom)
    vmem_fits: bool | None
    vmem_limit_bytes: int | None  # what the kernel asks Mosaic for; None: the target's default scoped limit
    default_scoped_vmem: int | None  # the target's default scoped limit
    vmem_capacity: int | None  # the target's VMEM per TensorCore
    device_kind: str
    libtpu: str | None

    def line(self) -> str:
        """One line for the terminal."""
        from .lowering import vmem_text

        head = f"{self.method:<12} {self.target:<4} {f'{self.block_q}x{self.block_kv}':>10}"
        vmem = vmem_text(self.vmem_bytes, self.vmem_budget, self.vmem_fits, self.vmem_limit_bytes, self.target,
                         self.default_scoped_vmem)
        if self.ok:
            return (f"{head} ok      build {self.build_s:6.2f} s  compile {self.compile_s:5.1f} s  "
                    f"args {self.argument_bytes / MiB:6.1f} MiB  out {self.output_bytes / MiB:5.1f} MiB  "
                    f"temp {self.temp_bytes / MiB:5.1f} MiB  code {self.code_bytes / KiB:5.0f} KiB  {vmem}")
        who = {"estimate": f"our {self.stage.upper()} estimate", "build": "build",
               "compiler": "the TPU compiler"}[self.refused_by]
        return f"{head} FAILED  refused by {who} ({self.stage}): {self.summary}  [{vmem}]"

    def to_json(self) -> dict:
        return asdict(self)


def compile_for_tpu(config, method: str, target: str = DEFAULT_TARGET, *, check_estimate: bool = True) -> CompileReport:
    """Build `method` for `config` (a svg_lib.bench.BenchConfig) and compile it for `target`.

    The real TPU compiler (libtpu) runs here on the CPU for a compile-only chip of `target`
    ("v6e", "v5e", ...; see TARGETS): Mosaic kernels compiled, VMEM and SMEM allocated and
    checked, nothing run. With `check_estimate`, a configuration whose VMEM estimate does not
    fit the target is refused before compiling (a compile that overflows VMEM only fails after
    most of its work); pass False to hear the compiler's own verdict.

    Never raises for a configuration that fails to build, fit or compile: the report says so
    (`ok=False`, `stage`, `refused_by`, `error`). Bad arguments raise ValueError / TypeError;
    a machine without libtpu raises RuntimeError saying what to install.
    """
    return compile_all(config, (method,), (target,), check_estimate=check_estimate)[0]


def compile_all(config, methods=None, targets=(DEFAULT_TARGET,), progress=None, *,
                check_estimate: bool = True) -> list[CompileReport]:
    """`compile_for_tpu` for every method (default: every Pallas kernel) and target, method by method.

    Each method is built for each target in turn, so that its VMEM limit is that chip's
    (Splash's mask info takes tens of seconds to build at the blog's size). `progress(report)` is called as each one finishes.
    """
    from .bench import PALLAS_METHODS
    from .lowering import build_failure_stage, build_for_tpu, check_methods, check_tpu_arguments, vmem_facts
    from .vmem import check_block_kv_compute

    methods = check_methods(PALLAS_METHODS if methods is None else methods, "compile")
    targets = check_targets(targets)
    for method in methods:
        check_tpu_arguments(config, method, "compile")
    require_libtpu()
    version = libtpu_version()
    compute = check_block_kv_compute(config.block_kv, config.block_kv_compute, config.block_q)
    reports = []
    asked = None  # what build_attention gives the current method's kernel as vmem_limit_bytes

    def report(method, spec, facts, **fields):
        values = dict(stage=None, refused_by=None, error=None, summary=None, build_s=None, compile_s=None,
                      argument_bytes=None, output_bytes=None, temp_bytes=None, code_bytes=None)
        values.update(fields)
        r = CompileReport(method, spec.name, config.block_q, config.block_kv, compute, values.pop("ok", False),
                          **values, vmem_bytes=facts["vmem_bytes"],
                          vmem_budget=facts["vmem_budget"], vmem_fits=facts["vmem_fits"],
                          vmem_limit_bytes=asked, default_scoped_vmem=spec.default_scoped_vmem,
                          vmem_capacity=spec.vmem_bytes, device_kind=spec.device_kind,
                          libtpu=version)
        reports.append(r)
        if progress is not None:
            progress(r)

    for method in methods:
        per_target = [(spec, vmem_facts(config, method, spec.name)) for spec in targets]
        to_compile = []
        for spec, facts in per_target:
            asked = None if method.startswith("splash") else facts["vmem_limit_bytes"]
            if check_estimate and not facts["vmem_fits"]:
                report(method, spec, facts, stage="vmem", refused_by="estimate",
                       error=_estimate_refusal(config, method, spec),
                       summary=f"needs {facts['vmem_bytes'] / MiB:.1f} MiB, the {spec.name} budget is "
                               f"{facts['vmem_budget'] / MiB:.0f} MiB")
            else:
                to_compile.append((spec, facts))
        if not to_compile:
            continue
        for spec, facts in to_compile:
            # built for this target, so its VMEM limit (and Splash's raised default) is this chip's;
            # building is cheap except Splash's mask info at large sizes
            asked = None if method.startswith("splash") else facts["vmem_limit_bytes"]
            start = time.perf_counter()
            try:
                fn, build_s = build_for_tpu(config, method, spec.name)
            except Exception as err:  # a report, not a crash: every outcome should be seen
                stage = build_failure_stage(facts, err)
                report(method, spec, facts, stage=stage, refused_by="build" if stage == "build" else "estimate",
                       error=first_lines(err), summary=first_lines(err, 1), build_s=time.perf_counter() - start)
                continue
            report(method, spec, facts, build_s=build_s,
                   **compile_verdict(fn, [(config.shape, config.dtype)] * 3, spec.name))
            del fn
    return reports


def compile_verdict(fn, shapes, target: str = DEFAULT_TARGET) -> dict:
    """Compile `fn` for `target` (see `compile_fn`) and say how it went, never raising for a refusal.

    Returns a dict: ok, stage ("vmem", "smem", "compile" or None), refused_by ("compiler" or
    None), error (first lines), summary (one line), compile_s, and when ok the memory_analysis
    sizes argument_bytes, output_bytes, temp_bytes, code_bytes (None otherwise).
    """
    start = time.perf_counter()
    try:
        compiled, compile_s = compile_fn(fn, shapes, target)
        memory = compiled.memory_analysis()
    except Exception as err:  # the compiler's refusal is the answer, not a crash
        return dict(ok=False, stage=classify_error(err), refused_by="compiler", error=first_lines(err),
                    summary=refusal_summary(err), compile_s=time.perf_counter() - start, argument_bytes=None,
                    output_bytes=None, temp_bytes=None, code_bytes=None)
    return dict(ok=True, stage=None, refused_by=None, error=None, summary=None, compile_s=compile_s,
                argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
                temp_bytes=int(memory.temp_size_in_bytes), code_bytes=int(memory.generated_code_size_in_bytes))


def compile_gradient(config, method: str, target: str = DEFAULT_TARGET, *, heads: int | None = None) -> dict:
    """Compile `jax.grad` of `method`'s attention (for q, k and v) for `target`; `compile_verdict`'s dict.

    The forward with its log-sum-exp, and the backward's dq and dk/dv kernels (svg_lib.backward),
    in one program, at `config`'s size. `heads` overrides the config's: every head runs the same
    kernels on its own slice, so one head compiles the same kernels in a fraction of the time.
    """
    import jax
    import jax.numpy as jnp

    from .attention import build_attention

    heads = config.heads if heads is None else heads
    mask = None if method in ("dense", "splash_dense") else config.mask()
    f = build_attention(mask, method=method, heads=heads, tokens=config.tokens, head_dim=config.head_dim,
                        dtype=config.dtype, block_q=config.block_q, block_kv=config.block_kv,
                        block_kv_compute=config.block_kv_compute, interpret=False, generation=target)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    return compile_verdict(grad, [((heads, config.tokens, config.head_dim), config.dtype)] * 3, target)


def _estimate_refusal(config, method, spec) -> str:
    """The VMEM estimate's refusal in words, with a configuration that fits `spec` if there is one."""
    from .vmem import check_fits, estimate_vmem

    estimate = estimate_vmem(method, config.block_q, config.block_kv, config.head_dim, config.dtype,
                             config.block_kv_compute, spec.name)
    try:
        check_fits(estimate)
    except ValueError as err:
        return f"ValueError: {err}"
    return "ValueError: the VMEM estimate does not fit"  # not reached: only called when it does not fit


def check_targets(targets) -> tuple:
    """Targets as a tuple of TpuTarget: one name, several, or "all"; ValueError for unknown ones."""
    if isinstance(targets, (str, TpuTarget)):
        targets = (targets,)
    names = []
    for t in targets:
        names.extend(TARGETS if t == "all" else [t])
    specs = tuple(dict.fromkeys(check_target(t) for t in names))
    if not specs:
        raise ValueError(f"no target given; choose from {', '.join(TARGETS)} or 'all'")
    return specs



# -- command line ----------------------------------------------------------------------------

def _compile_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--target", action="append", metavar="NAME",
                        help=f"TPU generation to compile for: {', '.join(TARGETS)} or all; may be given "
                             f"several times (default {DEFAULT_TARGET})")
    parser.add_argument("--list-targets", action="store_true",
                        help="print the targets with their VMEM, SMEM and MXU facts, and exit")
    parser.add_argument("--sweep-block-q", metavar="BQ,...",
                        help="compile at each of these query blocks in turn (instead of --block-q's one)")
    parser.add_argument("--no-estimate-check", action="store_true",
                        help="compile even where the VMEM estimate says the blocks will not fit")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON to PATH")


def _compile_run(args: argparse.Namespace) -> int:
    from .bench import PALLAS_METHODS, config_from_args, methods_from_args, write_json
    from .cli import UsageError
    from .lowering import splash_note

    if args.list_targets:
        print(targets_table())
        return 0
    try:
        targets = check_targets(args.target or [DEFAULT_TARGET])
    except ValueError as err:
        raise UsageError(f"--target: {err}") from None
    config = config_from_args(args)
    configs = [config]
    if args.sweep_block_q:
        try:
            configs = [dataclasses.replace(config, block_q=int(bq)) for bq in args.sweep_block_q.split(",") if bq.strip()]
        except ValueError as err:
            raise UsageError(f"--sweep-block-q takes comma-separated multiples of 128 like 1024,3328: {err}") from None
        if not configs:
            raise UsageError("--sweep-block-q needs at least one value, e.g. 1024,3328")
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
        reports += compile_all(one, methods, targets, progress=lambda r: print(r.line(), flush=True),
                               check_estimate=not args.no_estimate_check)
    failed = [f"{r.method} {r.block_q}x{r.block_kv} on {r.target}" for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} compiled"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + ". Compiled for TPU by libtpu: VMEM/SMEM allocation and Mosaic checked; no speed measured.",
          flush=True)
    if args.json:
        import datetime

        write_json(args.json, {"config": config.to_json(), "sweep_block_q": [c.block_q for c in configs],
                               "date": datetime.date.today().isoformat(), "jax": jax.__version__,
                               "libtpu": libtpu_version(),
                               "targets": [asdict(t) for t in targets],
                               "reports": [r.to_json() for r in reports]})
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


def _command():
    from .cli import Command
    return Command("compile", "compile the Pallas kernels for a TPU generation with the real TPU compiler "
                   "(libtpu, on this CPU; nothing runs)", _compile_arguments, _compile_run)


COMMAND = _command()
