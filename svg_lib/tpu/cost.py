"""Per-tile cost on a TPU, read from the TPU compiler's own simulation (no TPU needed).

libtpu can dump, for every kernel it compiles, a *static LLO profile*: `estimated_cycles`
is a cycle-level simulation of one call of the whole kernel (every grid step, DMA waits
included), and the final VLIW bundles say how much code the kernel is. This module reads
both for small *probe kernels* and turns them into what a cost model needs:

    from svg_lib import tile_cost
    cost = tile_cost("v6e", block_q=512, block_kv=256)
    cost.cycles_per_step("svg_lib", "free"), cost.cycles_per_step("splash", "free")

    python -m svg_lib cost --target v6e --preset small [--json]

What it reports, per kernel (ours: "svg_lib"; JAX's Splash: "splash") and block size:
- cycles per grid step of each tile-body kind: "free" (mask-free), "svg_masked" (the SVG
  band-and-sink predicate evaluated elementwise), "padding_masked" (only `k < tokens`) and
  "idle" (a skipped step: no body, no DMA);
- cycles per query-tile row that do not depend on the steps (init, finish, q and output DMA);
- bundles: the probe kernel's total scheduled bundles, and per body kind the difference to
  the kernel without a body (the tile body's code size).

The instrument's limits, and why the probes look as they do:
- The simulator follows branches on program ids exactly (an untaken `pl.when` costs
  nothing) but reads every scalar-prefetched (SMEM) value as 0, so the real B1/B2/B3 kernels,
  whose step classes come from SMEM tables, would simulate as all-idle. Each probe therefore
  takes its step class from the program id: every step of a probe is one kind.
- Splash has no idle or padding probe: its skipping is driven by SMEM tables. Its "free"
  probe is Splash's kernel with no mask tables (what a FullMask gives); its "svg_masked"
  probe is Splash's mask-function path with the SVG predicate on every step (how Splash
  handles a computable mask, e.g. the exact SVG mask at large sizes).
- Cycles per step = difference of `estimated_cycles` between probes with 2 and 4 steps
  (one query tile), divided by 2; per-row cost = the difference between 2 query tiles and 1
  (2 steps each), less 2 steps. No clock rate is reported: compare cycles, never convert them
  to seconds.
- LIBTPU_INIT_ARGS is read once, when libtpu starts, so the probes compile in a subprocess
  started with the dump flags set; results are cached per libtpu version, jax version and the
  source of the kernels (`cache_dir()`), so a notebook rereads them instantly.

Evidence kind of every number here: *simulated by the TPU compiler's static profile*
(compile-only, nothing run). jax is imported inside functions.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from svg_lib import cache as cache_files  # `cache` is a parameter name here
from svg_lib.attention import b3_mask
from svg_lib.chips import check_target
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import SVGMask, check_block_size
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.environment import require_libtpu
from svg_lib.kernels import backward
from svg_lib.kernels import forward as kernels
from svg_lib.kernels.forward import MASK_VALUE
from svg_lib.problem import check_block_kv_compute
from svg_lib.tpu.compiler import compile_fn
from svg_lib.tpu.errors import first_lines

BODY_KINDS = ("free", "svg_masked", "padding_masked", "idle")
COST_KERNELS = ("svg_lib", "splash")
# The backward's probes: our dq and dk/dv kernels (svg_lib.kernels.backward), Splash's two backward
# kernels (dq; dk and dv), and Splash's fused backward kernel, which computes dq, dk and dv of a
# tile in one step (writing dq once per key tile, summed afterwards).
BACKWARD_KERNELS = ("svg_lib_dq", "svg_lib_dkv", "splash_dq", "splash_dkv", "splash_fused")
BACKWARD_PAIRS = {"svg_lib": ("svg_lib_dq", "svg_lib_dkv"), "splash": ("splash_dq", "splash_dkv"),
                  "splash_fused": ("splash_fused",)}
BACKWARD_KINDS = ("free", "svg_masked")
SPLASH_KINDS = ("free", "svg_masked")  # Splash's idle and padding steps are table-driven: not probeable
CACHE_FORMAT = 1
PROBE_STEPS = (2, 4)      # kv steps of the two probes whose difference gives cycles per step
PROBE_ROWS = (1, 2)       # query tiles of the two probes whose difference gives the per-row cost
EVIDENCE = "simulated by the TPU compiler's static LLO profile (compile-only, not measured)"


def cache_dir() -> Path:
    """Where cost results live: beside the tuner's cache, in `.../svg_lib/cost`."""
    return cache_files.cache_dir("cost")


def versions() -> dict:
    """jax and libtpu versions, and a digest of the kernel sources the probes compile."""
    import importlib.metadata as md

    import jax

    digest = hashlib.sha256("".join(_code_only(Path(__file__).resolve().parents[1] / "kernels" / name)
                                    for name in ("forward.py", "backward.py")).encode())
    try:
        libtpu = md.version("libtpu")
    except md.PackageNotFoundError:
        libtpu = None
    return {"jax": jax.__version__, "libtpu": libtpu, "source": digest.hexdigest()[:16]}


def _code_only(path: Path) -> str:
    """The module's code without comments and docstrings: what the probes compile (the probes
    themselves are covered by CACHE_FORMAT), so that editing prose keeps the cache."""
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


# -- the probe kernels (compiled in the child process) --------------------------------------

@dataclass(frozen=True)
class Probe:
    """One probe kernel: `kernel` ("svg_lib" or "splash"), every step of body `kind`,
    `rows` query tiles x `steps` kv steps of one head."""

    kernel: str
    kind: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    rows: int
    steps: int
    bodies: tuple = ()     # extra, never-taken bodies compiled in (svg_lib only), to test branch cost

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _svg_predicate(block_q: int, tokens: int):
    """The SVG band-and-sink predicate, at a size where the probe's tiles straddle the band."""
    # A mask whose band edge runs through the probe's tiles; the kernel evaluates the predicate
    # on every element regardless, so only its arithmetic (not its geometry) affects the cost.
    g = VideoGeometry(max(2, tokens // 128), 8, 16)
    return SVGMask.spatial(g, 0.35).kernel_predicate(block_q, block_q)


def _svg_lib_probe(p: Probe, name: str, target: str = "v6e"):
    """A kernel built on svg_lib's tile body whose step class comes from the program id."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    tokens = p.steps * p.block_kv
    svg_keep = _svg_predicate(p.block_q, tokens)

    def padding_keep(q_ids, k_ids):
        return k_ids < tokens - 1  # a run-time comparison, like the real kernels' padding test

    keeps = {"free": None, "svg_masked": svg_keep, "padding_masked": padding_keep}
    bodies = [b for b in (p.kind, *p.bodies) if b != "idle"]
    bodies = list(dict.fromkeys(bodies))

    def kernel(q_ref, k_ref, v_ref, o_ref, *scratch):
        i, s = pl.program_id(1), pl.program_id(2)
        tile = functools.partial(kernels._online_softmax_tile, q_ref, k_ref, v_ref, *scratch,
                                 q_start=i * p.block_q, k_start=s * p.block_kv,
                                 block_kv_compute=p.block_kv_compute, interpret=False)
        # this step's kind: the probe's kind on every step, decided at run time from the
        # program id so that the compiler keeps every body and the simulator can follow it
        code = jnp.where(s < p.steps, BODY_KINDS.index(p.kind), len(BODY_KINDS))

        @pl.when(s == 0)
        def _():
            kernels._init_state(*scratch)

        for body in bodies:
            pl.when(code == BODY_KINDS.index(body))(functools.partial(tile, keep=keeps[body]))

        @pl.when(s == p.steps - 1)
        def _():
            kernels._finish(*scratch, o_ref)

    if p.kind == "idle":
        kv_map = lambda h, i, s: (h, 0, 0)  # an idle step repeats the resident block: no DMA
    else:
        kv_map = lambda h, i, s: (h, s, 0)
    call = pl.pallas_call(
        kernel,
        grid=(1, p.rows, p.steps),
        in_specs=[pl.BlockSpec((None, p.block_q, p.head_dim), lambda h, i, s: (h, i, 0)),
                  pl.BlockSpec((None, p.block_kv, p.head_dim), kv_map),
                  pl.BlockSpec((None, p.block_kv, p.head_dim), kv_map)],
        out_specs=pl.BlockSpec((None, p.block_q, p.head_dim), lambda h, i, s: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct((1, p.rows * p.block_q, p.head_dim), jnp.bfloat16),
        scratch_shapes=kernels._scratch(p.block_q, p.head_dim),
        compiler_params=kernels._compiler_params(_probe_vmem_limit(target)),
        name=name,
    )
    return call


def _probe_vmem_limit(target: str) -> int | None:
    """None (the compiler's default) where that default is a v6e's 32 MiB or more; else 3/4 of the
    chip's VMEM, so that large tiles compile on a chip whose default scoped VMEM is smaller."""
    t = check_target(target)
    return None if t.default_scoped_vmem >= 32 * 2**20 else t.vmem_bytes * 3 // 4


def _splash_probe(p: Probe, name: str, target: str = "v6e"):
    """Splash's forward kernel with no mask tables: every step runs (free), or every step runs
    its mask-function path with the SVG predicate (svg_masked)."""
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    if p.kind not in SPLASH_KINDS:
        raise ValueError(f"Splash has no {p.kind!r} probe (its skipping reads SMEM tables); "
                         f"probeable: {SPLASH_KINDS}")
    tokens = p.steps * p.block_kv
    masked = p.kind == "svg_masked"
    info = mi.MaskInfo(data_next=None, mask_next=None, block_mask=None, partial_mask_blocks=None,
                       q_sequence=np.arange(p.rows * p.block_q, dtype=np.int32) if masked else None)
    sizes = sk.BlockSizes(block_q=p.block_q, block_kv=p.block_kv, block_kv_compute=p.block_kv_compute)
    predicate = _svg_predicate(p.block_q, tokens) if masked else None

    limit = _probe_vmem_limit(target)

    def call(q, k, v):
        if limit is None:
            return sk._splash_attention_forward(info, q, k, v, None, None, kernels_mask_value(), False, sizes,
                                                None, False, predicate)
        # Splash sets no VMEM limit of its own, so on a chip with a small default (a v5e's 16 MiB)
        # it does not compile at large tiles; the probe gives it the same limit as svg_lib's probes.
        original = sk.pltpu.CompilerParams

        def with_limit(**kwargs):
            return original(**{"vmem_limit_bytes": limit, **kwargs})
        sk.pltpu.CompilerParams = with_limit
        try:
            return sk._splash_attention_forward(info, q, k, v, None, None, kernels_mask_value(), False, sizes,
                                                None, False, predicate)
        finally:
            sk.pltpu.CompilerParams = original
    return call


def kernels_mask_value() -> float:
    return MASK_VALUE


def _backward_probe(p: Probe, name: str, target: str = "v6e"):
    """svg_lib's dq or dk/dv kernel with every step of kind `p.kind` (from the program id), or
    Splash's fused backward with no mask tables (every step runs; "svg_masked": its
    mask-function path with the SVG predicate). dq: `rows` query tiles x `steps` key tiles;
    dk/dv and Splash's: `rows` key tiles x `steps` query tiles. Takes (q, k, v); the other
    operands (do, the log-sum-exp, D) are made from them outside the kernel."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if p.kind not in BACKWARD_KINDS:
        raise ValueError(f"backward probes know {BACKWARD_KINDS}, not {p.kind!r}")
    tokens = (p.steps if p.kernel == "svg_lib_dq" else p.rows) * p.block_kv
    keep = _svg_predicate(p.block_q, tokens) if p.kind == "svg_masked" else None
    limit = _probe_vmem_limit(target)
    if p.kernel.startswith("splash"):
        return _splash_backward_probe(p, keep, limit)
    dq = p.kernel == "svg_lib_dq"
    block_rows, block_cols = (p.block_q, p.block_kv) if dq else (p.block_kv, p.block_q)

    def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, *outs_and_scratch):
        r, s = pl.program_id(1), pl.program_id(2)
        outs, accs = outs_and_scratch[:-2 + dq], outs_and_scratch[-2 + dq:]

        @pl.when(s == 0)
        def _():
            for acc in accs:
                acc[...] = jnp.zeros(acc.shape, jnp.float32)

        q_start, k_start = (r * p.block_q, s * p.block_kv) if dq else (s * p.block_q, r * p.block_kv)
        body = backward._dq_tile if dq else backward._dkv_tile
        pl.when(s < p.steps)(lambda: body(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, *accs, keep=keep,
                                          q_start=q_start, k_start=k_start, block_kv_compute=p.block_kv_compute))

        @pl.when(s == p.steps - 1)
        def _():
            for out, acc in zip(outs, accs):
                out[...] = acc[...].astype(out.dtype)

    fixed = lambda h, r, s: (h, r, 0)   # noqa: E731  the row's own block
    moving = lambda h, r, s: (h, s, 0)  # noqa: E731  the step's block
    row_spec = pl.BlockSpec((None, block_rows, p.head_dim), fixed)
    col_spec = pl.BlockSpec((None, block_cols, p.head_dim), moving)
    q_spec, kv_spec = (row_spec, col_spec) if dq else (col_spec, row_spec)
    stat = pl.BlockSpec((None, 1, p.block_q), lambda h, r, s: (h, 0, r if dq else s))  # lse and D rows
    n_out = 1 if dq else 2
    out_rows = p.rows * block_rows
    call = pl.pallas_call(
        kernel, grid=(1, p.rows, p.steps),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, stat, stat],
        out_specs=[row_spec] * n_out,
        out_shape=[jax.ShapeDtypeStruct((1, out_rows, p.head_dim), jnp.bfloat16)] * n_out,
        scratch_shapes=[pltpu.VMEM((block_rows, p.head_dim), jnp.float32)] * n_out,
        compiler_params=kernels._compiler_params(limit), name=name)

    def fn(q, k, v):
        stat = q[:, None, :, 0].astype(jnp.float32)  # any per-query row: the cost does not depend on it
        return call(q, k, v, q, stat, stat)
    return fn


def _splash_backward_probe(p: Probe, predicate, limit):
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    q_len = p.steps * p.block_q
    info = mi.MaskInfo(data_next=None, mask_next=None, block_mask=None, partial_mask_blocks=None,
                       q_sequence=np.arange(q_len, dtype=np.int32) if predicate is not None else None)
    layout = sk.QKVLayout.HEAD_DIM_MINOR

    common = dict(is_mqa=False, mask_info=info, mask_value=kernels_mask_value(), attn_logits_soft_cap=None,
                  q_layout=layout, k_layout=layout, v_layout=layout, mask_function=predicate, interpret=False)

    def fn(q, k, v):
        stat = q[:, :, 0].astype(jnp.float32)  # [heads, q_len]: logsumexp and D, as Splash holds them
        original = sk.pltpu.CompilerParams

        def with_limit(**kwargs):
            return original(**{"vmem_limit_bytes": limit, **kwargs})
        if limit is not None:  # the same limit as our probes (see _splash_probe)
            sk.pltpu.CompilerParams = with_limit
        try:
            if p.kernel == "splash_dq":  # Splash's dq kernel takes whole key tiles (no compute slices)
                return sk._splash_attention_bwd_dq(q, k, v, None, None, stat, q, stat, bq=p.block_q, bkv=p.block_kv,
                                                   **common)
            return sk._splash_attention_bwd_dkv(q, k, v, None, None, stat, q, stat, bq=p.block_q, bkv=p.block_kv,
                                                bkv_compute=p.block_kv_compute,
                                                use_fused_bwd_kernel=p.kernel == "splash_fused", **common)
        finally:
            sk.pltpu.CompilerParams = original
    return fn


def _compile_probe(p: Probe, target: str, name: str):
    if p.kernel == "svg_lib":
        fn = _svg_lib_probe(p, name, target)
    elif p.kernel == "splash":
        fn = _splash_probe(p, name, target)
    elif p.kernel in BACKWARD_KERNELS:
        fn = _backward_probe(p, name, target)
    else:
        raise ValueError(f"unknown kernel {p.kernel!r}; known: {COST_KERNELS + BACKWARD_KERNELS}")
    # rows run along the grid's second axis: query tiles for the forward and dq, key tiles for dk/dv
    by_query = p.kernel in ("svg_lib", "splash", "svg_lib_dq", "splash_dq")
    q_tiles, kv_tiles = (p.rows, p.steps) if by_query else (p.steps, p.rows)
    q = ((1, q_tiles * p.block_q, p.head_dim), "bfloat16")
    kv = ((1, kv_tiles * p.block_kv, p.head_dim), "bfloat16")
    compile_fn(fn, [q, kv, kv], target)


_CYCLES = re.compile(r"estimated_cycles:\s*(\d+)")
_BUNDLES = re.compile(r"total scheduled bundles:\s*(\d+)")


def _read_dumps(profile_dir: str, bundle_dir: str | None) -> dict:
    """estimated_cycles and bundles of the one kernel compiled since the dirs were emptied."""
    cycles = []
    for path in glob.glob(os.path.join(profile_dir, "*_static_llo_profile.textproto")):
        cycles += [int(c) for c in _CYCLES.findall(Path(path).read_text())]
    out = {"cycles": max(cycles) if cycles else None}
    if bundle_dir is not None:
        bundles = None
        for path in glob.glob(os.path.join(bundle_dir, "*-00-schedule-analysis_final_bundles.txt")):
            if "TLP" in path or "<late" in path:
                continue  # the program around the kernel, not the kernel
            m = _BUNDLES.search(Path(path).read_text())
            if m:
                bundles = max(bundles or 0, int(m.group(1)))
        out["bundles"] = bundles
    return out


def _clear(*dirs):
    for d in dirs:
        if d:
            for path in glob.glob(os.path.join(d, "*")):
                os.remove(path)


def _child(request: dict) -> list[dict]:
    """In the child process (dump flags already set): compile each probe, read its dumps."""
    # `python -m svg_lib.tpu.cost` has run svg_lib/__init__.py first: libtpu sharing is set up
    profile_dir, bundle_dir = request["profile_dir"], request.get("bundle_dir")
    results = []
    for n, raw in enumerate(request["probes"]):
        p = Probe(**{**raw, "bodies": tuple(raw.get("bodies", ()))})
        _clear(profile_dir, bundle_dir)
        start = time.perf_counter()
        try:
            _compile_probe(p, request["target"], f"cost_probe_{n}")
            row = _read_dumps(profile_dir, bundle_dir)
        except Exception as err:  # report, keep going: one failing probe should not lose the rest
            row = {"cycles": None, "error": first_lines(err, 3)}
        row["compile_s"] = round(time.perf_counter() - start, 2)
        results.append(row)
        print(json.dumps({"done": n + 1, "of": len(request["probes"])}), file=sys.stderr, flush=True)
    _clear(profile_dir, bundle_dir)
    return results


def run_probes(probes: list[Probe], target: str, *, bundles: bool = True, timeout: float = 3600) -> list[dict]:
    """Compile `probes` for `target` in one subprocess with the compiler's dump flags set.

    Returns one dict per probe: cycles (estimated_cycles), bundles, compile_s (or error)."""
    require_libtpu()
    check_target(target)
    with tempfile.TemporaryDirectory(prefix="svg_cost_") as tmp:
        profile_dir = os.path.join(tmp, "profile")
        bundle_dir = os.path.join(tmp, "bundles") if bundles else None
        os.makedirs(profile_dir)
        flags = [f"--xla_jf_dump_static_llo_profile_to={profile_dir}"]
        if bundle_dir:
            os.makedirs(bundle_dir)
            flags += [f"--xla_jf_dump_to={bundle_dir}", "--xla_jf_dump_llo_text=true",
                      "--xla_jf_dump_llo_pass_label_regex=final_bundles"]
        env = dict(os.environ)
        env["LIBTPU_INIT_ARGS"] = " ".join([env.get("LIBTPU_INIT_ARGS", ""), *flags]).strip()
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
        request = {"target": target, "profile_dir": profile_dir, "bundle_dir": bundle_dir,
                   "probes": [p.to_json() for p in probes]}
        req_path = os.path.join(tmp, "request.json")
        Path(req_path).write_text(json.dumps(request))
        log_path = os.environ.get("SVG_LIB_COST_LOG") or os.path.join(tmp, "child.log")
        with open(log_path, "w") as log:  # libtpu is chatty on stderr; keep it out of the caller's output
            proc = subprocess.run([sys.executable, "-m", "svg_lib.tpu.cost", "--child", req_path], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out_path = req_path + ".out"
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = "\n".join(Path(log_path).read_text().strip().splitlines()[-8:])
            raise RuntimeError(f"the probe compiler process failed (exit {proc.returncode}):\n{tail}")
        return json.loads(Path(out_path).read_text())


# -- the measurement --------------------------------------------------------------------------

@dataclass
class TileCost:
    """Simulated cost of each tile-body kind for one block size (see the module docstring).

    `per_step[kernel][kind]` cycles per grid step, `per_row[kernel]` cycles per query tile
    beyond its steps, `bundles[kernel][kind]` total scheduled bundles of the probe kernel, and
    `body_bundles[kernel][kind]` that less the bundles of the body-less probe (svg_lib only)."""

    target: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    per_step: dict
    per_row: dict
    bundles: dict
    body_bundles: dict
    versions: dict
    raw: list = field(default_factory=list)
    from_cache: bool = False
    cache_path: str | None = None
    evidence: str = EVIDENCE

    def cycles_per_step(self, kernel: str, kind: str) -> float | None:
        return self.per_step.get(kernel, {}).get(kind)

    def ratio(self, kind: str = "free") -> float | None:
        """svg_lib's cycles per step of `kind` over Splash's (<= 1: ours is as cheap or cheaper)."""
        ours, theirs = self.cycles_per_step("svg_lib", kind), self.cycles_per_step("splash", kind)
        return None if not ours or not theirs else ours / theirs

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("from_cache", "cache_path")}

    @classmethod
    def from_json(cls, data: dict, **extra) -> "TileCost":
        return cls(**{**data, **extra})

    def table(self) -> str:
        head = (f"tile cost on {self.target}, {self.block_q} x {self.block_kv} tiles (block_kv_compute "
                f"{self.block_kv_compute}), head_dim {self.head_dim}, bf16; {self.evidence}; "
                f"libtpu {self.versions.get('libtpu')}, jax {self.versions.get('jax')}")
        lines = [head, f"{'kernel':8} {'body':15} {'cycles/step':>12} {'vs splash':>10} {'bundles':>9} "
                       f"{'body bundles':>13}"]
        for kernel in COST_KERNELS:
            for kind in BODY_KINDS:
                c = self.cycles_per_step(kernel, kind)
                if c is None:
                    continue
                ref = self.cycles_per_step("splash", kind if kind in SPLASH_KINDS else "free")
                rel = f"{c / ref:.2f}x" if ref and kernel == "svg_lib" and kind != "idle" else ""
                b = self.bundles.get(kernel, {}).get(kind)
                bb = self.body_bundles.get(kernel, {}).get(kind)
                lines.append(f"{kernel:8} {kind:15} {c:12,.0f} {rel:>10} {b or '':>9} {'' if bb is None else bb:>13}")
            if kernel in self.per_row:
                lines.append(f"{kernel:8} {'per q-tile row':15} {self.per_row[kernel]:12,.0f}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _cache_path(key: dict) -> Path:
    return cache_dir() / f"{cache_files.key_digest(key)}.json"


def probes_for(block_q: int, block_kv: int, block_kv_compute: int, head_dim: int = 128,
               kernels=COST_KERNELS, kinds=BODY_KINDS, per_row: bool = True) -> list[Probe]:
    """Every probe `tile_cost` compiles for one block size (the per-row probe needs "free")."""
    out = []
    for kernel in kernels:
        probeable = BODY_KINDS if kernel == "svg_lib" else SPLASH_KINDS
        for kind in [k for k in probeable if k in kinds]:
            for steps in PROBE_STEPS:
                out.append(Probe(kernel, kind, block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[0], steps))
        if per_row and "free" in kinds:
            out.append(Probe(kernel, "free", block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[1],
                             PROBE_STEPS[0]))
    return out


def _summarise(probes: list[Probe], rows: list[dict]) -> tuple[dict, dict, dict, dict]:
    cyc = {(p.kernel, p.kind, p.rows, p.steps): r.get("cycles") for p, r in zip(probes, rows)}
    bun = {(p.kernel, p.kind, p.rows, p.steps): r.get("bundles") for p, r in zip(probes, rows)}
    errors = [f"{p}: {r['error']}" for p, r in zip(probes, rows) if r.get("error")]
    if errors:
        raise RuntimeError("probe kernels failed to compile:\n" + "\n".join(errors))
    (r1, r2), (s1, s2) = PROBE_ROWS, PROBE_STEPS
    per_step, per_row, bundles, body_bundles = {}, {}, {}, {}
    for kernel, kind in sorted({(p.kernel, p.kind) for p in probes}):
        a, b = cyc[(kernel, kind, r1, s1)], cyc[(kernel, kind, r1, s2)]
        per_step.setdefault(kernel, {})[kind] = (b - a) / (s2 - s1)
        bundles.setdefault(kernel, {})[kind] = bun[(kernel, kind, r1, s1)]
    for kernel in per_step:
        two = cyc.get((kernel, "free", r2, s1))
        if two is not None:
            per_row[kernel] = (two - cyc[(kernel, "free", r1, s1)]) - s1 * per_step[kernel]["free"]
        base = bundles[kernel].get("idle")
        if base is not None:
            body_bundles[kernel] = {k: (v - base if v is not None else None) for k, v in bundles[kernel].items()}
    return per_step, per_row, bundles, body_bundles


def tile_cost(target: str = "v6e", *, block_q: int, block_kv: int, block_kv_compute: int | None = None,
              head_dim: int = 128, kernels=COST_KERNELS, kinds=BODY_KINDS, per_row: bool = True,
              refresh: bool = False) -> TileCost:
    """Simulated cycles per grid step of each tile-body kind, svg_lib's and Splash's (cached).

    Compiles up to 14 small probe kernels in a subprocess the first time (a minute or two on
    a CPU at 512 x 256 tiles, much longer at the blog's 3328 x 1536), then reads the cache.
    `kernels` and `kinds` limit what is probed (Splash has only "free" and "svg_masked");
    `per_row=False` leaves out the per-row probe (the model then counts no per-row cost)."""
    check_target(target)
    block_q, block_kv = check_block_size("block_q", block_q), check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    for k in kernels:
        if k not in COST_KERNELS:
            raise ValueError(f"unknown kernel {k!r}; tile_cost knows {COST_KERNELS}")
    for k in kinds:
        if k not in BODY_KINDS:
            raise ValueError(f"unknown tile-body kind {k!r}; tile_cost knows {BODY_KINDS}")
    v = versions()
    path = _cache_path(_cache_key(target, block_q, block_kv, block_kv_compute, head_dim, kernels, kinds, v, per_row))
    if path.exists() and not refresh:
        return TileCost.from_json(json.loads(path.read_text()), from_cache=True, cache_path=str(path))
    probes = probes_for(block_q, block_kv, block_kv_compute, head_dim, kernels, kinds, per_row)
    rows = run_probes(probes, target)
    return _store(path, target, probes, rows, v)


def _cache_key(target, block_q, block_kv, block_kv_compute, head_dim, kernels, kinds, v, per_row=True) -> dict:
    key = {"format": CACHE_FORMAT, "what": "tile_cost", "target": target, "block_q": block_q,
           "block_kv": block_kv, "block_kv_compute": block_kv_compute, "head_dim": head_dim,
           "kernels": list(kernels), **v}
    if tuple(kinds) != BODY_KINDS:
        key["kinds"] = list(kinds)
    if not per_row:
        key["per_row"] = False
    return key


def _store(path: Path, target: str, probes: list[Probe], rows: list[dict], v: dict) -> TileCost:
    p0 = probes[0]
    block_q, block_kv, block_kv_compute, head_dim = p0.block_q, p0.block_kv, p0.block_kv_compute, p0.head_dim
    per_step, per_row, bundles, body_bundles = _summarise(probes, rows)
    raw = [{**p.to_json(), **r} for p, r in zip(probes, rows)]
    result = TileCost(target, block_q, block_kv, block_kv_compute, head_dim, per_step, per_row, bundles,
                      body_bundles, v, raw)
    cache_files.write_json_atomic(path, result.to_json())
    result.cache_path = str(path)
    return result




@dataclass
class BackwardCost:
    """Simulated cycles per grid step of the backward kernels at one block size.

    `per_step[kernel][kind]` for kernel in BACKWARD_KERNELS. Our backward and Splash's default
    one run two steps per visited tile (one in the dq pass, one in the dk/dv pass), Splash's
    fused kernel one; `per_tile(who)` sums a tile's steps for who in BACKWARD_PAIRS."""

    target: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    per_step: dict
    versions: dict
    raw: list = field(default_factory=list)
    evidence: str = EVIDENCE

    def per_tile(self, who: str, kind: str = "free") -> float | None:
        steps = [self.per_step.get(k, {}).get(kind) for k in BACKWARD_PAIRS[who]]
        return None if None in steps else sum(steps)

    def ratio(self, kind: str = "free", versus: str = "splash") -> float | None:
        """Our backward's cycles per tile over Splash's two kernels' (or `versus="splash_fused"`)."""
        ours, theirs = self.per_tile("svg_lib", kind), self.per_tile(versus, kind)
        return None if not ours or not theirs else ours / theirs

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def table(self) -> str:
        lines = [f"backward tile cost on {self.target}, {self.block_q} x {self.block_kv} tiles (block_kv_compute "
                 f"{self.block_kv_compute}), head_dim {self.head_dim}, bf16; {self.evidence}; "
                 f"libtpu {self.versions.get('libtpu')}, jax {self.versions.get('jax')}",
                 f"{'kernel':12} {'body':11} {'cycles/step':>12}"]
        for kernel in BACKWARD_KERNELS:
            for kind, cycles in self.per_step.get(kernel, {}).items():
                lines.append(f"{kernel:12} {kind:11} {cycles:12,.0f}")
        for kind in BACKWARD_KINDS:
            if self.ratio(kind) is not None:
                lines.append(f"per tile, {kind}: svg_lib dq + dkv {self.per_tile('svg_lib', kind):,.0f}; Splash dq + dkv "
                             f"{self.per_tile('splash', kind):,.0f} ({self.ratio(kind):.2f}x); Splash fused "
                             f"{self.per_tile('splash_fused', kind):,.0f} ({self.ratio(kind, 'splash_fused'):.2f}x)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def backward_tile_cost(target: str = "v6e", *, block_q: int, block_kv: int, block_kv_compute: int | None = None,
                       head_dim: int = 128, kinds=("free",), refresh: bool = False) -> BackwardCost:
    """Simulated cycles per grid step of our dq and dk/dv kernels and Splash's fused backward
    (cached like `tile_cost`; compiled in a subprocess the first time)."""
    check_target(target)
    block_q, block_kv = check_block_size("block_q", block_q), check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    bad = [k for k in kinds if k not in BACKWARD_KINDS]
    if bad:
        raise ValueError(f"unknown backward body kind(s) {bad}; backward_tile_cost knows {BACKWARD_KINDS}")
    v = versions()
    key = {**_cache_key(target, block_q, block_kv, block_kv_compute, head_dim, BACKWARD_KERNELS, BODY_KINDS, v),
           "what": "backward_tile_cost", "kinds": list(kinds)}
    path = _cache_path(key)
    if path.exists() and not refresh:
        return BackwardCost(**json.loads(path.read_text()))
    probes = [Probe(kernel, kind, block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[0], steps)
              for kernel in BACKWARD_KERNELS for kind in kinds for steps in PROBE_STEPS]
    rows = run_probes(probes, target, bundles=False)
    errors = [f"{p}: {r['error']}" for p, r in zip(probes, rows) if r.get("error")]
    if errors:
        raise RuntimeError("backward probe kernels failed to compile:\n" + "\n".join(errors))
    cycles = {(p.kernel, p.kind, p.steps): r["cycles"] for p, r in zip(probes, rows)}
    (s1, s2) = PROBE_STEPS
    per_step = {kernel: {kind: (cycles[kernel, kind, s2] - cycles[kernel, kind, s1]) / (s2 - s1) for kind in kinds}
                for kernel in BACKWARD_KERNELS}
    result = BackwardCost(target, block_q, block_kv, block_kv_compute, head_dim, per_step, v,
                          [{**p.to_json(), **r} for p, r in zip(probes, rows)])
    cache_files.write_json_atomic(path, result.to_json())
    return result


# -- the committed reference measurements ----------------------------------------------------
# Compiling the probes at the blog's tiles takes many minutes on a CPU, so the series commits one
# set of results (svg_lib/data/cost_reference.json, written by `save_reference`) that notebooks
# read; `tile_cost` recomputes any of them on this machine.
REFERENCE_FILE = Path(__file__).resolve().parents[1] / "data" / "cost_reference.json"


def save_reference(groups: dict, path: Path = REFERENCE_FILE, note: str = "") -> Path:
    """Write `{group: [TileCost, ...]}` (e.g. "after" / "before" a kernel change) as the reference."""
    import datetime

    data = {"evidence": EVIDENCE, "date": datetime.date.today().isoformat(), "versions": versions(), "note": note,
            "groups": {g: [{k: v for k, v in c.to_json().items() if k != "raw"} for c in costs]
                       for g, costs in groups.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_reference(path: Path = REFERENCE_FILE) -> dict:
    """The committed reference: {"date", "versions", "evidence", "note", "groups": {group: {(target,
    block_q, block_kv): TileCost}}}."""
    data = json.loads(Path(path).read_text())
    data["groups"] = {g: {(c["target"], c["block_q"], c["block_kv"]): TileCost.from_json(c, from_cache=True,
                                                                                       cache_path=str(path))
                          for c in costs} for g, costs in data["groups"].items()}
    return data


def filled_from(cost: TileCost, fallback: TileCost, *, padding_as_free: bool = False) -> TileCost:
    """`cost` with the kernels, kinds and per-row costs it did not probe taken from `fallback`
    (the same block size). With `padding_as_free`, a missing padding_masked cost is taken as
    `cost`'s own mask-free cost instead. Say so wherever the result is shown."""
    import copy

    if (cost.block_q, cost.block_kv) != (fallback.block_q, fallback.block_kv):
        raise ValueError(f"block sizes differ: {cost.block_q} x {cost.block_kv} vs {fallback.block_q} x {fallback.block_kv}")
    out = copy.deepcopy(cost)
    for kernel, kinds in fallback.per_step.items():
        mine = out.per_step.setdefault(kernel, {})
        if padding_as_free and "padding_masked" not in mine and "free" in mine and "padding_masked" in kinds:
            mine["padding_masked"] = mine["free"]
        for kind, cycles in kinds.items():
            mine.setdefault(kind, cycles)
    for kernel, cycles in fallback.per_row.items():
        out.per_row.setdefault(kernel, cycles)
    return out


# -- the cost model from the plan -------------------------------------------------------------

MODEL_METHODS = ("splash_dense", "dense", "b1", "b2", "b3")
# the case study's measured ratios to B0 (one v6e, its problem and blocks), for comparison only
BLOG_RATIOS = {"splash_dense": 1.0, "b1": 96.37 / 78.70, "b2": 54.12 / 78.70, "b3": 32.76 / 78.70}


def step_kinds(method: str, plan=None, b3_plan=None, *, tokens: int | None = None) -> dict:
    """How many grid steps (per head) of each body kind `method` runs, and its query-tile rows.

    splash_dense / dense: every tile (dense masks the key tiles that reach into padding,
    Splash's full mask needs no masking); b1: every visited tile masked with the SVG
    predicate; b2: full tiles free, partial tiles masked; b3: the tile-aligned plan, whose
    masked tiles mask only key padding. Idle steps pad each row to the plan's `steps`.
    """
    if method in ("splash_dense", "dense"):
        p = plan if plan is not None else b3_plan
        nq, nk = p.classes.shape
        padded = nk * p.block_kv != p.mask.tokens
        if method == "splash_dense":
            return {"rows": nq, "free": nq * nk}
        return {"rows": nq, "free": nq * (nk - padded), "padding_masked": nq * padded}
    p = b3_plan if method == "b3" else plan
    if p is None:
        raise ValueError(f"{method} needs its plan (plan_tiles of the {'tile-aligned' if method == 'b3' else 'exact'} mask)")
    sc = p.step_class
    full, partial, idle = int((sc == FULL).sum()), int((sc == PARTIAL).sum()), int((sc == EMPTY).sum())
    nq = sc.shape[0]
    if method == "b1":
        return {"rows": nq, "svg_masked": full + partial, "idle": idle}
    if method == "b2":
        return {"rows": nq, "free": full, "svg_masked": partial, "idle": idle}
    if method == "b3":
        return {"rows": nq, "free": full, "padding_masked": partial, "idle": idle}
    raise ValueError(f"unknown method {method!r}; the model knows {MODEL_METHODS}")


def model_cycles(method: str, cost: TileCost, plan=None, b3_plan=None, heads: int = 1) -> float:
    """Simulated cycles of one call of `method`: sum over grid steps of that step's body cost,
    plus the per-row cost of each query tile; `heads` times that (heads run one after another
    on one TensorCore)."""
    kinds = step_kinds(method, plan, b3_plan)
    kernel = "splash" if method == "splash_dense" else "svg_lib"
    per_step = cost.per_step[kernel]
    total = kinds.pop("rows") * cost.per_row.get(kernel, 0.0)  # per-row cost unprobed: left out
    for kind, n in kinds.items():
        total += n * per_step[kind]
    return heads * total


def cost_model(mask, costs, *, block_q: int, block_kv: int, heads: int = 1, methods=MODEL_METHODS) -> dict:
    """Model cycles of each method for `mask` at `block_q` x `block_kv`, from `costs` (a TileCost
    for that block size). Returns {method: cycles} and {method + "/b0": ratio to splash_dense}."""
    plan = plan_tiles(mask, block_q, block_kv)
    b3_plan = plan_tiles(b3_mask(mask, block_q, block_kv), block_q, block_kv)
    out = {m: model_cycles(m, costs, plan, b3_plan, heads) for m in methods}
    if "splash_dense" in out:
        out.update({f"{m}/b0": out[m] / out["splash_dense"] for m in methods})
    return out


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _request_path = sys.argv[2]
    _out = _child(json.loads(Path(_request_path).read_text()))
    Path(_request_path + ".out").write_text(json.dumps(_out))
