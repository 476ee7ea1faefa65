"""The VMEM estimate held against the TPU compiler: compile a kernel at its blocks and compare.

`compile_check(estimate)` compiles the estimate's kernel (one head, a 2 x 2 grid of tiles: VMEM
depends on the blocks, not the tokens) for a compile-only TPU with libtpu and says whether the
compiler agrees; `verify_against_compiler` sweeps a grid of them, `largest_block_q` bisects for
the largest query tile that compiles, and `load_largest_block_q` reads the recorded results.
`python -m svg_lib vmem --sweep | --largest` (svg_lib/cli/vmem.py). Needs libtpu; nothing runs on a TPU.
"""
from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass

from svg_lib.core.masks import LANES
from svg_lib.core.planner import FULL, PARTIAL, pack_schedule
from svg_lib.kernels.backward import attention_dkv, attention_dq, attention_fused
from svg_lib.kernels.forward import block_sparse_attention, dense_flash_attention
from svg_lib.kernels.splash import _block_mask, _computable_mask, _splash, with_vmem_limit
from svg_lib.memory.vmem import SPLASH_METHODS, KiB, MiB, VmemEstimate, estimate_vmem
from svg_lib.methods import METHODS, SERIES_FIRST_METHODS
from svg_lib.progress import bar as progress_bar
from svg_lib.runtime import tpu_memory
from svg_lib.instruments.tpu.compiler import compile_fn
from svg_lib.instruments.tpu.errors import classify_error, first_lines

# -- the estimate against the TPU compiler ---------------------------------------------------

# The compiler refuses in one of two ways: a kernel's scoped allocation over its limit, or the
# whole program's VMEM (scoped allocations plus what Mosaic keeps of a kernel's intermediate
# values) over the chip's capacity.
_SCOPED = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]?) and limit ([\d.]+)([KMG]?)"
                     r"|Used ([\d.]+)([KMG]?) of ([\d.]+)([KMG]?) vmem")
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": 2**30}


def reported_scoped_bytes(err: BaseException | str) -> tuple[int, int] | None:
    """(size, limit) in bytes from the compiler's VMEM refusal, or None if it names none."""
    m = _SCOPED.search(str(err))
    if m is None:
        return None
    size, unit, limit, limit_unit = (g for g in m.groups() if g is not None) if m.group(1) is None else m.groups()[:4]
    return int(float(size) * _UNITS[unit]), int(float(limit) * _UNITS[limit_unit])


@dataclass(frozen=True)
class CompilerCheck:
    """One kernel compiled for a TPU target next to our estimate of it.

    `limit` is the scoped VMEM the kernel was compiled under: the limit the estimate asks for
    (the chip's default when it asks for none) where the estimate says it fits, the chip's
    whole VMEM where the estimate refuses (could the compiler have fitted it at all?).
    `reported` is the size the compiler names in its refusal: the kernel's scoped allocation,
    or the whole program's VMEM (see the module docstring). `agrees` and `conservative` judge
    the estimate, so they mean something only under that limit (`compile_check`'s default)."""

    estimate: VmemEstimate
    target: str
    limit: int
    compiled: bool
    reported: int | None
    error: str | None
    seconds: float

    @property
    def agrees(self) -> bool:
        """False only when the estimate said "fits" and the compiler refused."""
        return self.compiled or not self.estimate.fits

    @property
    def conservative(self) -> bool:
        """The estimate refused what the compiler accepted (allowed; reported)."""
        return self.compiled and not self.estimate.fits

    def row(self) -> dict:
        e = self.estimate
        return {"method": e.method, "target": self.target, "block_q": e.block_q, "block_kv": e.block_kv,
                "block_kv_compute": e.block_kv_compute, "dtype": e.dtype, "splash_mask": e.splash_mask,
                "estimate_mib": round(e.total / MiB, 2), "estimate_fits": e.fits,
                "limit_mib": round(self.limit / MiB, 2), "compiled": self.compiled,
                "reported_mib": None if self.reported is None else round(self.reported / MiB, 2),
                "agrees": self.agrees, "seconds": round(self.seconds, 1)}

    def __str__(self) -> str:
        e = self.estimate
        verdict = "compiles" if self.compiled else ("refused" + (f" (scoped {self.reported / MiB:.2f} MiB)"
                                                                 if self.reported else ""))
        flag = "" if self.agrees else "  <-- DISAGREES"
        method = f"{e.method}[{e.splash_mask}]" if e.splash_mask else e.method
        return (f"{self.target:4} {method:23} {e.block_q:>5}x{e.block_kv:<5} c{e.block_kv_compute:<5} "
                f"{e.dtype:8} estimate {e.total / MiB:6.1f} MiB {'fits' if e.fits else 'refuses':7} | "
                f"limit {self.limit / MiB:6.1f} MiB: {verdict}{flag}")


def _check_kernel(estimate: VmemEstimate, limit: int | None):
    """`(fn, shapes)`: the pallas_call of `estimate`'s method at its blocks, one head, a 2 x 2 grid
    of tiles, compiled under the scoped VMEM `limit` (None: the chip's default)."""
    import jax
    import jax.numpy as jnp

    e = estimate
    bq, bkv, c = e.block_q, e.block_kv, e.block_kv_compute
    q_len, kv_len = 2 * bq, 2 * bkv
    tokens = kv_len - LANES  # a padded key column, so the kernels' masked paths exist
    # Splash takes whole tiles, its key padding masked; the series' kernels take q, k and v as they
    # are, the last tiles partial (cleared in VMEM), as attention() calls them
    whole = e.method.startswith("splash")
    shapes = [((1, q_len if whole else q_len - LANES, e.head_dim), e.dtype)] + [
        ((1, kv_len if whole else tokens, e.head_dim), e.dtype)] * 2

    def band(q_ids, k_ids):  # numpy on the host (Splash's blocks), jnp in a kernel
        return (abs(q_ids - k_ids) <= bkv) & (k_ids < tokens)

    if ":" in e.method:
        return _backward_check_kernel(e, limit, tokens), shapes
    record = METHODS.get(e.method)
    if record is not None and record.dense and not record.splash:
        return (lambda q, k, v: dense_flash_attention(q, k, v, block_q=bq, block_kv=bkv, block_kv_compute=c,
                                                      interpret=False, vmem_limit_bytes=limit)), shapes
    if record is not None and record.planned:
        import numpy as np

        classes = record.step_classes([[FULL, PARTIAL], [PARTIAL, FULL]])
        schedule = jnp.asarray(pack_schedule(np.array([[0, 1], [0, 1]]), np.array(classes)))
        head_kind = jnp.zeros((1,), jnp.int32)
        return (lambda q, k, v: block_sparse_attention(q, k, v, head_kind, schedule, steps=2, method=METHODS[e.method],
                                                       keep=band, block_q=bq, block_kv=bkv, block_kv_compute=c,
                                                       interpret=False, vmem_limit_bytes=limit)), shapes
    sa, sm = _splash()
    shape = (q_len, kv_len)
    mask = {"full": lambda: sm.FullMask(shape),
            "blocks": lambda: _block_mask(shape, band, ("vmem-check", shape, tokens)),
            "computable": lambda: _computable_mask(shape, band, ("vmem-check", shape, tokens))}[e.splash_mask]()
    kernel = sa.make_splash_mha_single_device(
        sm.MultiHeadMask([mask]), block_sizes=sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=c),
        interpret=False)
    # the limit travels as build_attention gives it: in Splash's own CompilerParams
    return jax.jit(kernel if limit is None else with_vmem_limit(kernel, limit)), shapes


def _backward_check_kernel(e: VmemEstimate, limit: int | None, tokens: int):
    """`fn(q, k, v)`: the backward kernel `e.method` names ("b3:dq", "b3:dkv", "b3:fused", ...) over a
    2 x 2 grid of tiles of which two are mask-free and two masked (as B2's; B1 masks all four), the
    other operands (dO, the log-sum-exp and D) made from q outside the kernel. The fused kernel holds
    the 2 query tiles' dq: its estimate must be made with `q_len=2 * block_q`."""
    import jax.numpy as jnp
    import numpy as np

    stage, _, which = e.method.partition(":")
    bq, bkv, c = e.block_q, e.block_kv, e.block_kv_compute
    classes = METHODS[stage].step_classes([[FULL, PARTIAL], [PARTIAL, FULL]])
    schedule = None if not METHODS[stage].planned else jnp.asarray(pack_schedule(np.array([[0, 1], [0, 1]]), classes))

    def keep(q_ids, k_ids):
        return (abs(q_ids - k_ids) <= bkv) & (k_ids < tokens)

    common = dict(method=METHODS[stage], keep=keep, block_q=bq, block_kv=bkv, block_kv_compute=c, interpret=False,
                  vmem_limit_bytes=limit)

    def fn(q, k, v):
        rows = q[:, None, :, 0].astype(jnp.float32)  # any per-query rows: VMEM does not depend on them
        if which == "dq":
            return attention_dq(q, k, v, q, rows, rows, schedule, steps=2, **common)
        kernel = attention_fused if which == "fused" else attention_dkv
        return kernel(q, k, v, q, rows, rows, schedule, steps_t=2, **common)
    return fn


def compile_check(estimate: VmemEstimate, target: str | None = None, limit: int | None = -1) -> CompilerCheck:
    """Compile `estimate`'s kernel for `target` (default: the estimate's generation) and compare.

    `limit=-1` picks the limit described in `CompilerCheck`; pass bytes (or None for the chip's
    default) to compile under another. Needs libtpu (see `svg_lib.instruments.tpu.compiler`)."""
    target = target or estimate.generation
    memory = tpu_memory(target)
    if limit == -1:
        limit = estimate.vmem_limit_bytes if estimate.fits else memory.vmem_bytes
    fn, shapes = _check_kernel(estimate, limit)
    effective = limit if limit is not None else memory.default_scoped
    start = time.perf_counter()
    try:
        compile_fn(fn, shapes, target)
    except Exception as err:  # the compiler's refusals arrive as JaxRuntimeError
        if classify_error(err) != "vmem":
            raise
        sizes = reported_scoped_bytes(err)
        return CompilerCheck(estimate, target, effective, False, sizes[0] if sizes else None,
                             first_lines(err, 2), time.perf_counter() - start)
    return CompilerCheck(estimate, target, effective, True, None, None, time.perf_counter() - start)


def sweep_points(methods=SERIES_FIRST_METHODS, blocks=((1024, 512),),
                 dtypes=("bfloat16",), targets=("v6e",), block_kv_computes=(None,), splash_masks=("blocks",),
                 head_dim: int = 128) -> list[tuple[VmemEstimate, str]]:
    """Every `(estimate, target)` of a sweep, estimated and not compiled: a bad method, block, dtype or
    target is refused here, before the first compile, and the count says how long the sweep is.

    `blocks` are (block_q, block_kv) pairs; a block_kv_compute that does not divide block_kv
    is skipped."""
    points = []
    for target in targets:
        for method in methods:
            forms = splash_masks if method in SPLASH_METHODS else (None,)
            for (bq, bkv), dtype, c, form in itertools.product(blocks, dtypes, block_kv_computes, forms):
                if c is None or bkv % c == 0:
                    points.append((estimate_vmem(method, bq, bkv, head_dim, dtype, c, target, splash_mask=form),
                                   target))
    return points


def verify_points(points, log=None, bar: bool = False) -> list[CompilerCheck]:
    """`compile_check` each of `sweep_points`' `(estimate, target)`, one `CompilerCheck` each (see
    `agrees`). Each point compiles one head on a 2 x 2 grid of tiles: VMEM depends on the blocks,
    not on the token count. `log` (e.g. print) is called with each result; `bar` shows a progress
    bar naming the kernel compiling now (`svg_lib.progress`: stderr, silenced by --quiet)."""
    checks = []
    shown = progress_bar(total=len(points), desc="vmem sweep", unit="compile", show=bar)
    for e, target in points:
        shown.set_description(f"vmem sweep: {e.method} {e.block_q} x {e.block_kv} {e.dtype} on {target}")
        checks.append(compile_check(e, target))
        shown.update(1)
        if log:
            log(str(checks[-1]))
    shown.close()
    return checks


def verify_against_compiler(methods=SERIES_FIRST_METHODS,
                            blocks=((1024, 512),), dtypes=("bfloat16",), targets=("v6e",),
                            block_kv_computes=(None,), splash_masks=("blocks",), head_dim: int = 128,
                            log=None, bar: bool = False) -> list[CompilerCheck]:
    """Compile every combination (`sweep_points`) and return one `CompilerCheck` each (`verify_points`)."""
    return verify_points(sweep_points(methods, blocks, dtypes, targets, block_kv_computes, splash_masks, head_dim),
                         log=log, bar=bar)


def largest_block_q(method: str, target: str, block_kv: int = 1536, dtype="bfloat16", head_dim: int = 128,
                    splash_mask: str | None = None, block_kv_compute: int | None = None, step: int = 256,
                    lo: int | None = None, hi: int | None = None, limit: int | None = None, log=None) -> dict:
    """The largest multiple of `step` for block_q that the compiler accepts for `target` at
    `block_kv`, under the scoped `limit` (default: the chip's whole VMEM, the most a kernel
    can be given), with `block_kv_compute` (default: the kernel's default for each block_q).

    A bisection between `lo` (compiles) and `hi` (refused). Without `hi`, the first block_q
    whose double-buffered blocks and scratch alone exceed the limit (the compiler's scoped
    allocation is at least that). Compiles near the limit are slow at large tiles (minutes),
    so give a tight bracket where one is known."""
    memory = tpu_memory(target)
    limit = memory.vmem_bytes if limit is None else limit
    say = log or (lambda _: None)

    def estimate(bq):
        return estimate_vmem(method, bq, block_kv, head_dim, dtype, block_kv_compute, target, splash_mask=splash_mask)

    if hi is None:
        hi = step
        while estimate(hi).pipeline + estimate(hi).scratch <= limit:
            hi += step
    lo = lo or step
    tried = {}

    def compiles(bq):
        tried[bq] = compile_check(estimate(bq), target, limit=limit)
        say(f"  {tried[bq]}")
        return tried[bq].compiled

    if not compiles(lo):
        raise RuntimeError(f"block_q={lo} is already refused: give a smaller lo")
    if compiles(hi):
        raise RuntimeError(f"block_q={hi} compiles: give a larger hi")
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if compiles(mid):
            lo = mid
        else:
            hi = mid
    fitting = [b for b in range(step, hi + 1, step) if estimate(b).fits]
    return {"method": method, "target": target, "block_kv": block_kv, "dtype": jnp_name(dtype), "head_dim": head_dim,
            "splash_mask": splash_mask if method in SPLASH_METHODS else None,
            "block_kv_compute": block_kv_compute or "default", "limit_mib": limit / MiB,
            "largest_block_q": lo, "refused_block_q": hi,
            "refused_mib": None if tried[hi].reported is None else round(tried[hi].reported / MiB, 2),
            "refusal": (tried[hi].error or "").splitlines()[-1][:160],
            "estimate_largest_block_q": max(fitting, default=0),
            "compiles": len(tried), "compile_seconds": round(sum(c.seconds for c in tried.values()), 1)}


def jnp_name(dtype) -> str:
    import jax.numpy as jnp
    return jnp.dtype(dtype).name


LARGEST_BLOCK_Q_FILE = "data/largest_block_q.json"  # compiled-for-TPU evidence, in svg_lib/data


def load_largest_block_q() -> dict:
    """The recorded `largest_block_q` results (compiled for TPU, libtpu compile-only; see the file)."""
    import json
    from pathlib import Path
    return json.loads((Path(__file__).resolve().parents[2] / LARGEST_BLOCK_Q_FILE).read_text())
