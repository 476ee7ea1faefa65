"""Block-size tuning: time one attention method over a grid of tile sizes and keep the fastest.

    from svg_lib import SVGMask, VideoGeometry, tune
    result = tune(SVGMask.spatial(VideoGeometry(21, 16, 30), 0.35), heads=2, head_dim=128)
    print(result.table()); result.heatmap(); result.scatter()

A candidate is `(block_q, block_kv)` or `(block_q, block_kv, block_kv_compute)`. Candidates
that cannot run here are dropped with the reason recorded (`result.rejected`): not a multiple
of 128, larger than the token count padded to whole lanes, a `block_kv_compute` that does not
divide `block_kv`, or more VMEM than the TPU this runs on (a v6e when there is none) can give.
With `target="v6e"` (any name of svg_lib.chips.TARGETS) each remaining candidate is also
compiled for that TPU by the real TPU compiler (libtpu, on this CPU; nothing runs there), and
those it refuses (a VMEM or SMEM overflow, ...) are dropped with its reason. Compiles are
slow, so each verdict is cached beside the results, keyed by the libtpu and jax versions.

Each valid candidate is built with `build_attention` (planning, not timed), compiled, warmed
up and timed `repeats` times; the median counts. Next to the time go what the blog's lesson
is about: the fraction of visited tiles that need a mask, the fraction of tiles visited, the
grid steps and the VMEM estimate. Results are cached as JSON (see `cache_dir`), keyed by
device kind, jax version and the problem, so rerunning a notebook is instant.

jax and matplotlib are imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from svg_lib import cache as cache_files  # `cache` is a parameter name here
from svg_lib.attention import build_attention
from svg_lib.chips import check_target
from svg_lib.core.masks import LANES, Mask, TileAlignedMask, check_block_size
from svg_lib.core.svg_masks import PermutedMask, SVGMask
from svg_lib.core.planner import PARTIAL, plan_tiles
from svg_lib.environment import libtpu_version, require_libtpu
from svg_lib.memory.smem import SmemOverflowError
from svg_lib.memory.vmem import MiB, estimate_vmem
from svg_lib.methods import METHODS, PALLAS_METHODS
from svg_lib.problem import check_block_kv_compute, get_preset, resolve_problem
from svg_lib.progress import bar as progress_bar
from svg_lib.runtime import default_interpret, detect_runtime
from svg_lib.instruments.tools.tune_result import TuneResult
from svg_lib.instruments.tpu.compiler import compile_verdict
from svg_lib.instruments.tpu.errors import first_lines

TUNE_METHODS = PALLAS_METHODS  # every Pallas kernel has block sizes to tune
CACHE_FORMAT = 1  # bump when the stored rows change meaning
DEFAULT_AXIS_VALUES = 4  # block sizes per axis in the default grid


def cache_dir() -> Path:
    """Where tuning results live: `svg_lib.cache.cache_dir("tune")`."""
    return cache_files.cache_dir("tune")


# -- candidates ---------------------------------------------------------------------------

def padded_tokens(tokens: int) -> int:
    """`tokens` rounded up to whole lanes: the largest block size worth trying."""
    return -(-int(tokens) // LANES) * LANES


def default_candidates(tokens: int, per_axis: int = DEFAULT_AXIS_VALUES) -> list[tuple[int, int]]:
    """A modest grid scaled to the problem: up to `per_axis` sizes per axis, log-spaced.

    The sizes are 128 x powers of two from about tokens / 64 up to the padded token count
    (tiles much smaller than that make a huge grid of tiny steps; larger ones are all padding).
    """
    top = padded_tokens(tokens)
    low = max(LANES, top // 64)
    sizes = [LANES * 2 ** k for k in range(0, 32) if low <= LANES * 2 ** k <= top]
    if not sizes:
        sizes = [LANES]
    if len(sizes) > per_axis:
        picks = np.unique(np.rint(np.linspace(0, len(sizes) - 1, per_axis)).astype(int))
        sizes = [sizes[p] for p in picks]
    return [(bq, bkv) for bq in sizes for bkv in sizes]


@dataclass(frozen=True)
class SweepProblem:
    """The problem a notebook sweeps with `tune`, chosen for the device it runs on.

    `candidates` holds `sizes x sizes` runnable tile sizes followed by `bad`, two candidates
    that no device can run (a block_q off the lane width, and a block_kv past the padded
    sequence), so a sweep also shows what the tuner refuses and why.
    """

    label: str        # "walkthrough" (interpret mode) or "blog" (compiled, on a TPU)
    geometry: object  # svg_lib.VideoGeometry
    density: float
    heads: int
    head_dim: int
    dtype: str
    sizes: tuple
    bad: tuple
    repeats: int

    @property
    def candidates(self) -> list:
        return [(bq, bkv) for bq in self.sizes for bkv in self.sizes] + list(self.bad)

    def mask(self):
        return SVGMask.spatial(self.geometry, self.density)

    def at(self, label: str, geometry, density: float) -> "SweepProblem":
        """The same sweep on another geometry and density, its bad candidates rebuilt for that geometry
        (the block_kv past the padded sequence moves with the token count)."""
        return replace(self, label=label, geometry=geometry, density=density, bad=_bad_candidates(geometry))

    def __str__(self) -> str:
        return (f"{self.geometry}, {self.heads} head{'s' if self.heads != 1 else ''} x {self.head_dim}, {self.dtype}, "
                f"{len(self.sizes)} x {len(self.sizes)} tile sizes + {len(self.bad)} that cannot run")


def sweep_problem(runtime) -> SweepProblem:
    """What notebook 05 sweeps on `runtime` (a `svg_lib.runtime.Runtime`, or anything with `.compiled`).

    In interpret mode (no TPU) the kernels are an XLA loop on the host, so the sweep stays at the
    walkthrough size: 2,520 tokens, one head, float32, tiles of 128 to 512, one timed call each.
    On a TPU (compiled kernels) a toy size would time only launch overhead, so the sweep runs the
    case study's problem (75,600 tokens, 10 heads x 128, bf16; q, k and v take 0.58 GB, a small share of a
    v5e's 16 GiB) over tiles around the study's 3328 x 1536, three timed calls each.
    """
    if getattr(runtime, "compiled", False):
        blog = get_preset("blog")
        # the grid holds the study's own 3328 x 1536 and its BQ = 1024 point; a size the chip's VMEM
        # cannot hold is rejected by the tuner with its reason, not run
        sizes, geometry, heads, head_dim, dtype, repeats = ((1024, 1536, 3328), blog.geometry, blog.heads,
                                                           blog.head_dim, blog.dtype, 3)
        label, density = "blog", blog.density
    else:
        walk = get_preset("walkthrough")   # its geometry, head and density; float32 and its own tile grid here
        sizes, geometry, heads, head_dim, dtype, repeats = ((128, 256, 512), walk.geometry, walk.heads,
                                                           walk.head_dim, "float32", 1)
        label, density = "walkthrough", walk.density
    return SweepProblem(label=label, geometry=geometry, density=density, heads=heads, head_dim=head_dim,
                        dtype=dtype, sizes=sizes, bad=_bad_candidates(geometry), repeats=repeats)


def _bad_candidates(geometry) -> tuple:
    """Two candidates no device runs on `geometry`: a block_q off the lane width, and a block_kv one lane
    past the padded sequence."""
    return (96, 128), (128, padded_tokens(geometry.tokens) + LANES)


def _normalise(candidate) -> tuple:
    try:
        values = tuple(candidate)
    except TypeError:
        raise ValueError(f"a candidate is (block_q, block_kv) or (block_q, block_kv, block_kv_compute), "
                         f"got {candidate!r}") from None
    if len(values) not in (2, 3):
        raise ValueError(f"a candidate is (block_q, block_kv) or (block_q, block_kv, block_kv_compute), "
                         f"got {candidate!r}")
    if len(values) == 2:
        values = values + (None,)
    return tuple(v if v is None or isinstance(v, bool) or not isinstance(v, (int, np.integer)) else int(v)
                 for v in values)


def check_candidates(candidates, *, tokens: int, head_dim: int, method: str = "b2", dtype="bfloat16",
                     generation: str | None = None) -> tuple[list[tuple], list[dict]]:
    """Split candidates into those that can run here and those that cannot (with the reason).

    Returns `(valid, rejected)`: valid `(block_q, block_kv, block_kv_compute or None)` triples in
    the order given (duplicates dropped), and one dict per rejected candidate with
    "block_q", "block_kv", "block_kv_compute" and "reason".
    """
    valid, rejected, seen = [], [], set()
    top = padded_tokens(tokens)
    for candidate in candidates:
        bq, bkv, bkvc = _normalise(candidate)
        if (bq, bkv, bkvc) in seen:
            continue
        seen.add((bq, bkv, bkvc))

        def reject(reason):
            rejected.append({"block_q": bq, "block_kv": bkv, "block_kv_compute": bkvc, "reason": reason})

        try:
            check_block_size("block_q", bq)
            check_block_size("block_kv", bkv)
        except ValueError as err:
            reject(str(err))
            continue
        too_big = [f"{name}={value}" for name, value in (("block_q", bq), ("block_kv", bkv)) if value > top]
        if too_big:
            reject(f"{' and '.join(too_big)} exceeds the {tokens:,} tokens padded to whole lanes ({top:,}): "
                   "the tile would be mostly padding")
            continue
        try:
            compute = check_block_kv_compute(bkv, bkvc, bq)
        except ValueError as err:
            reject(str(err))
            continue
        estimate = estimate_vmem(method, bq, bkv, head_dim, dtype, compute, generation)
        if not estimate.fits:
            reject(f"VMEM overflow: needs {estimate.total / MiB:.1f} MiB, the {estimate.generation} budget is "
                   f"{estimate.budget / MiB:.0f} MiB")
            continue
        valid.append((bq, bkv, bkvc))
    return valid, rejected


# -- the TPU compiler's verdict on a candidate ---------------------------------------------

def compile_check(mask: Mask, *, method: str, heads: int, head_dim: int, dtype, block_q: int, block_kv: int,
                  block_kv_compute: int | None, target: str, cache: bool = True) -> dict:
    """Whether the TPU compiler accepts `method` at these blocks for `target`: a dict with
    "ok", "stage", "summary" (why it refused), "compile_s" and "from_cache".

    Built with interpret=False and compiled for a compile-only `target` chip (see
    svg_lib.instruments.tpu.compiler). The verdict is cached in `cache_dir() / "compile"`, keyed by the libtpu
    and jax versions, the target, the problem and the blocks.
    """
    import jax

    require_libtpu()
    spec = check_target(target)
    key = {"format": CACHE_FORMAT, "libtpu": libtpu_version(), "jax": jax.__version__, "target": spec.name,
           "method": method, "problem": {"mask": describe_mask(mask), "heads": heads, "head_dim": head_dim,
                                         "dtype": np.dtype(dtype).name if not isinstance(dtype, str) else dtype},
           "blocks": [block_q, block_kv, block_kv_compute]}
    digest = cache_files.key_digest(key)
    path = cache_dir() / "compile" / f"{digest}.json"
    if cache and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored.get("key") == key:
                return dict(stored["verdict"], from_cache=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: compile again and overwrite
    try:
        fn = build_attention(mask, method=method, heads=heads, tokens=mask.tokens, head_dim=head_dim, dtype=dtype,
                             block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=False,
                             generation=spec.name)
    except Exception as err:  # a verdict, not a crash
        stage = "smem" if isinstance(err, SmemOverflowError) else "build"  # smem: our estimate, before compiling
        verdict = {"ok": False, "stage": stage, "summary": first_lines(err, 1), "compile_s": None}
    else:
        full = compile_verdict(fn, [((heads, mask.tokens, head_dim), dtype)] * 3, spec.name)
        verdict = {name: full[name] for name in ("ok", "stage", "summary", "compile_s")}
    if cache:
        cache_files.write_json_atomic(path, {"key": key, "verdict": verdict})
    return dict(verdict, from_cache=False)


# -- the problem, for the cache key --------------------------------------------------------

def describe_mask(mask: Mask) -> dict:
    """A JSON-ready description that tells masks apart: geometry, band, sink, density, pairs."""
    out = {"type": type(mask).__name__, "tokens": int(mask.tokens)}
    geometry = getattr(mask, "geometry", None)
    if geometry is not None:
        out["geometry"] = [geometry.frames, geometry.height, geometry.width, geometry.text_tokens]
    for name in ("band_width", "sink_tokens", "density"):
        value = getattr(mask, name, None)
        if value is not None:
            out[name] = value if isinstance(value, float) else int(value)
    if isinstance(mask, TileAlignedMask):
        out["tiles"] = [mask.block_q, mask.block_kv]
        out["kept_sha1"] = hashlib.sha1(np.packbits(mask.kept).tobytes()).hexdigest()
        if mask.source is not None:
            out["source"] = describe_mask(mask.source)
    elif isinstance(mask, PermutedMask):
        out["permuted"] = describe_mask(mask.permuted)
        out["pos_sha1"] = hashlib.sha1(np.ascontiguousarray(mask.pos).tobytes()).hexdigest()
    else:
        out["pairs"] = int(mask.pair_count)
    return out


def _runtime_key(interpret) -> dict:

    r = detect_runtime()
    mode = "compiled" if interpret is False else "interpret"
    key = {"platform": r.platform, "device_kind": r.device_kind, "jax": r.jax_version, "mode": mode}
    if interpret not in (None, True, False):
        key["interpret"] = repr(interpret)  # InterpretParams: a different simulation, a different time
    return key


def _cache_file(key: dict) -> Path:
    return cache_dir() / f"{cache_files.key_digest(key)}.json"


# -- progress --------------------------------------------------------------------------------

class _Progress:
    """`svg_lib.progress.bar` (tqdm on stderr, its widget in a notebook; `--quiet` silences it), or
    the caller's `(done, total, text)` callable; silent when off."""

    def __init__(self, total: int, enabled, desc: str = "tune"):
        self.total, self.enabled = total, bool(enabled)
        self.callback = enabled if callable(enabled) else None
        self.bar = progress_bar(total=total, desc=desc, unit="size", show=self.enabled and self.callback is None)

    def update(self, done: int, text: str) -> None:
        if not self.enabled:
            return
        if self.callback is not None:
            self.callback(done, self.total, text)
        else:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        self.bar.close()


# -- tune ----------------------------------------------------------------------------------

def _method_plan(mask: Mask, method: str, bq: int, bkv: int) -> dict:
    """Tiles visited and masked, and grid steps per head, of one call of `method` at bq x bkv."""
    n = mask.tokens
    nq, nk = -(-n // bq), -(-n // bkv)
    record = METHODS[method]
    if record.dense:
        masked = nq if nk * bkv != n else 0  # only the last key tile, when it reaches into padding
        return {"tiles_visited": nq * nk, "tiles_masked": masked, "grid_steps": nq * nk, "tiles_total": nq * nk}
    plan = plan_tiles(record.computed_mask(mask, bq, bkv), bq, bkv)
    visited = int(plan.visited.sum())
    masked = int((record.step_classes(plan.classes) == PARTIAL).sum())
    return {"tiles_visited": visited, "tiles_masked": masked, "grid_steps": nq * plan.steps, "tiles_total": nq * nk}


def _check_positive(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def tune(problem, *, heads: int | None = None, head_dim: int | None = None, method: str = "b2", candidates=None,
         dtype=None, repeats: int = 3, warmup: int = 1, interpret=None, cache: bool = True, progress=True,
         seed: int = 0, target: str | None = None) -> TuneResult:
    """Time `method` at each candidate tile size on this device; see the module docstring.

    `problem`: a `BenchConfig` (its mask, heads, head_dim and dtype; any given here wins) or a
    Mask (then give heads and head_dim; dtype defaults to bfloat16). Its block sizes are not
    used: the candidates are. q, k, v: `[heads, mask.tokens, head_dim]` standard normal in `dtype`.
    `candidates`: a list of `(block_q, block_kv[, block_kv_compute])`; None uses
    `default_candidates(mask.tokens)`.
    `progress`: True (a tqdm bar on stderr, its widget in a notebook; `--quiet` silences it), False, or a callable
    `(done, total, text)`. With `cache`, a result stored for the same device kind, jax version,
    problem, candidates, repeats and warm-up is returned at once (`from_cache=True`).
    `target` (e.g. "v6e"): also compile each candidate for that TPU (libtpu) and drop those the
    compiler refuses, with its reason in `rejected`; VMEM is then estimated for that chip.
    """
    import jax
    import jax.numpy as jnp

    mask, fields = resolve_problem(problem, needs=("heads", "head_dim"), heads=heads, head_dim=head_dim,
                                   dtype=dtype)
    heads, head_dim, dtype = fields["heads"], fields["head_dim"], fields["dtype"] or "bfloat16"
    if method not in TUNE_METHODS:
        raise ValueError(f"method must be one of {', '.join(TUNE_METHODS)}, got {method!r}")
    heads = _check_positive("heads", heads)
    head_dim = _check_positive("head_dim", head_dim)
    repeats = _check_positive("repeats", repeats)
    warmup = _check_positive("warmup", warmup, 0)
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    if candidates is None:
        candidates = default_candidates(mask.tokens)
    candidates = [_normalise(c) for c in candidates]
    if not candidates:
        raise ValueError("candidates is empty; give (block_q, block_kv) pairs or None for the default grid")
    if interpret is None:
        interpret = default_interpret()
    target_key = None
    if target is not None:
        spec = check_target(target)
        require_libtpu()
        target_key = {"name": spec.name, "libtpu": libtpu_version()}

    problem = {"mask": describe_mask(mask), "heads": heads, "head_dim": head_dim, "dtype": dtype.name}
    runtime = _runtime_key(interpret)
    key = {"format": CACHE_FORMAT, "runtime": runtime, "problem": problem, "method": method,
           "candidates": [list(c) for c in candidates], "repeats": repeats, "warmup": warmup, "seed": seed}
    if target_key is not None:  # only then, so that results cached without a target keep their keys
        key["target"] = target_key
    path = _cache_file(key)
    if cache and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored.get("key") == key:  # guards against a hash collision or a hand-edited file
                return TuneResult.from_json(stored["result"], from_cache=True, cache_path=str(path))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or stale: measure again and overwrite

    valid, rejected = check_candidates(candidates, tokens=mask.tokens, head_dim=head_dim, method=method,
                                       dtype=dtype, generation=spec.name if target else None)
    if target is not None:
        valid = _compile_filter(valid, rejected, mask, method=method, heads=heads, head_dim=head_dim, dtype=dtype,
                                target=spec.name, cache=cache, progress=progress)
    keys = jax.random.split(jax.random.key(seed), 3)
    shape = (heads, mask.tokens, head_dim)
    q, k, v = (jax.random.normal(kk, shape, dtype) for kk in keys)
    bar = _Progress(len(valid), progress, f"tune: timing {method}")
    rows = []
    try:
        for done, (bq, bkv, bkvc) in enumerate(valid):
            bar.update(done, f"{bq} x {bkv}")
            start = time.perf_counter()
            fn = build_attention(mask, method=method, heads=heads, tokens=mask.tokens, head_dim=head_dim,
                                 dtype=dtype, block_q=bq, block_kv=bkv, block_kv_compute=bkvc, interpret=interpret)
            build_s = time.perf_counter() - start
            start = time.perf_counter()
            compiled = fn.lower(q, k, v).compile()  # compile ahead, so that no timed call pays for it
            compile_s = time.perf_counter() - start
            for _ in range(warmup):
                compiled(q, k, v).block_until_ready()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                compiled(q, k, v).block_until_ready()
                times.append((time.perf_counter() - start) * 1e3)
            del compiled, fn
            tiles = _method_plan(mask, method, bq, bkv)
            compute = check_block_kv_compute(bkv, bkvc, bq)
            vmem = estimate_vmem(method, bq, bkv, head_dim, dtype, compute)
            rows.append({"block_q": bq, "block_kv": bkv, "block_kv_compute": bkvc,
                         "median_ms": statistics.median(times), "min_ms": min(times), "times_ms": times,
                         "masked_fraction": tiles["tiles_masked"] / max(tiles["tiles_visited"], 1),
                         "visited_fraction": tiles["tiles_visited"] / tiles["tiles_total"],
                         "tiles_visited": tiles["tiles_visited"], "tiles_masked": tiles["tiles_masked"],
                         "grid_steps": tiles["grid_steps"], "vmem_bytes": vmem.total, "build_s": build_s,
                         "compile_s": compile_s})
        bar.update(len(valid), "done")
    finally:
        bar.close()

    result = TuneResult(method=method, problem=problem, runtime=runtime, rows=rows, rejected=rejected,
                        repeats=repeats, warmup=warmup, from_cache=False, target=target_key)
    if cache and cache_files.write_json_atomic(path, {"key": key, "result": result.to_json()}):
        result.cache_path = str(path)
    return result


def _compile_filter(valid, rejected, mask, *, method, heads, head_dim, dtype, target, cache, progress) -> list:
    """The candidates of `valid` that the TPU compiler accepts for `target`; the others are
    appended to `rejected` with the compiler's reason."""
    kept = []
    bar = _Progress(len(valid), progress, f"tune: compiling the candidates for {target}")
    try:
        for done, (bq, bkv, bkvc) in enumerate(valid):
            bar.update(done, f"compile {bq} x {bkv} for {target}")
            verdict = compile_check(mask, method=method, heads=heads, head_dim=head_dim, dtype=dtype, block_q=bq,
                                    block_kv=bkv, block_kv_compute=bkvc, target=target, cache=cache)
            if verdict["ok"]:
                kept.append((bq, bkv, bkvc))
            else:
                who = {"build": "build_attention", "smem": "the SMEM estimate (before compiling)"}.get(
                    verdict["stage"], f"the TPU compiler (libtpu {libtpu_version()})")
                rejected.append({"block_q": bq, "block_kv": bkv, "block_kv_compute": bkvc,
                                 "reason": f"refused for {target} by {who}: {verdict['summary']}"})
        bar.update(len(valid), "compiled")
    finally:
        bar.close()
    return kept
