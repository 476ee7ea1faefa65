"""The real TPU compiler, run on this machine's CPU: compile for a TPU that is not attached.

The `libtpu` wheel holds the whole TPU compiler. JAX can hand it a *compile-only* device of
a named topology (`jax.experimental.topologies.get_topology_desc`), and `jax.jit(f).lower(
...).compile()` then compiles for that chip exactly as it would on a TPU VM: Mosaic kernels
included, VMEM and SMEM allocated and checked, nothing run. This is the strongest TPU
evidence the series has without a TPU (stronger than `jax.export` lowering, which stops
before any memory is allocated); it is still not a measurement of speed.

    from svg_lib.instruments.tpu.compiler import compile_only_device, compile_fn
    device = compile_only_device("v6e")
    compiled, seconds = compile_fn(f, [((10, 75_600, 128), "bfloat16")] * 3, target="v6e")
    compiled.memory_analysis()

Installing libtpu changes nothing for a CPU reader: `jax.devices()` still returns the CPU
and kernels still run in interpret mode. libtpu is needed only for what this module does;
without it, `require_libtpu()` raises with the pip command that installs it.

jax is imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import contextlib
import functools
import re
import time
from dataclasses import asdict, dataclass

from svg_lib.attention import build_attention
from svg_lib.chips import DEFAULT_TARGET, TARGETS, KiB, MiB, TpuTarget, check_target, check_topology
from svg_lib.environment import libtpu_version, require_libtpu
from svg_lib.memory.vmem import check_fits, estimate_vmem
from svg_lib.methods import METHODS
from svg_lib.problem import PALLAS_METHODS, check_block_kv_compute
from svg_lib.progress import bar as progress_bar
from svg_lib.instruments.tpu.errors import classify_error, first_lines, refusal_summary
from svg_lib.instruments.tpu.lowering import (
    build_failure_stage,
    build_for_tpu,
    check_methods,
    check_tpu_arguments,
    vmem_facts,
    vmem_text,
)


@functools.lru_cache(maxsize=None)
def compile_only_topology(target: str = DEFAULT_TARGET, topology: str | None = None):
    """jax's TopologyDescription for `target` (single chip), or for an explicit topology name
    such as "v6e:2x4" (an 8-chip slice), without any TPU attached. A name libtpu would not know
    is refused first, in words (`chips.check_topology`)."""
    name = check_topology(topology or check_target(target).topology)
    require_libtpu()
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="tpu", topology_name=name, chips_per_host_bounds=(1, 1, 1))


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
    """Build `method` for `config` (a svg_lib.problem.BenchConfig) and compile it for `target`.

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
                check_estimate: bool = True, bar: bool = False) -> list[CompileReport]:
    """`compile_for_tpu` for every method (default: every Pallas kernel) and target, method by method.

    Each method is built for each target in turn, so that its VMEM limit is that chip's
    (Splash's mask info takes tens of seconds to build at the blog's size). `progress(report)` is called as each one finishes.
    `bar`: show a progress bar (`svg_lib.progress`: stderr, silenced by --quiet) naming what compiles now.
    """
    methods = check_methods(PALLAS_METHODS if methods is None else methods, "compile")
    targets = check_targets(targets)
    for method in methods:
        check_tpu_arguments(config, method, "compile")
    require_libtpu()
    version = libtpu_version()
    compute = check_block_kv_compute(config.block_kv, config.block_kv_compute, config.block_q)
    reports = []
    asked = None  # what build_attention gives the current method's kernel as vmem_limit_bytes
    shown = progress_bar(total=len(methods) * len(targets), desc="compile", unit="kernel", show=bar)

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
        shown.update(1)
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
            shown.set_description(f"compile: {method} at {config.block_q} x {config.block_kv} for {spec.name}")
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
    shown.close()
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


def compile_gradient(config, method: str, target: str = DEFAULT_TARGET, *, heads: int | None = None,
                     backward: str | None = None) -> dict:
    """Compile `jax.grad` of `method`'s attention (for q, k and v) for `target`; `compile_verdict`'s dict.

    The forward with its log-sum-exp, and the backward's kernels (svg_lib.kernels.backward: the fused
    one, or dq and dk/dv; `backward` as in `build_attention`), in one program, at `config`'s size.
    `heads` overrides the config's: every head runs the same kernels on its own slice, so one head
    compiles the same kernels in a fraction of the time.
    """
    import jax
    import jax.numpy as jnp

    heads = config.heads if heads is None else heads
    mask = None if METHODS[method].dense else config.mask()
    f = build_attention(mask, method=method, heads=heads, tokens=config.tokens, head_dim=config.head_dim,
                        dtype=config.dtype, block_q=config.block_q, block_kv=config.block_kv,
                        block_kv_compute=config.block_kv_compute, interpret=False, generation=target,
                        backward=backward)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    return compile_verdict(grad, [((heads, config.tokens, config.head_dim), config.dtype)] * 3, target)


def _estimate_refusal(config, method, spec) -> str:
    """The VMEM estimate's refusal in words, with a configuration that fits `spec` if there is one."""
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
