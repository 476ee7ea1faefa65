"""The benchmark harness: time every attention method on one problem, next to the blog's figures.

    from svg_lib.instruments.tools.bench import run_benchmark
    from svg_lib.problem import BenchConfig
    result = run_benchmark(BenchConfig.from_preset("small"))
    print(result.table())
    result.plot()

For each method the kernel is built once (`build_attention`: planning, Splash's mask
info), compiled once, warmed up, then timed `repeats` times; building and compiling are
reported but never timed. Next to the times go the tiles that method visits and masks,
its error against the reference under the mask it really computes, and the blog's
measurement on a TPU v6e.

Where the numbers come from matters. On a TPU the kernels run compiled (Mosaic). Anywhere
else they run in interpret mode: an XLA loop on the host, in which skipped tiles really are
skipped, so times follow the tiles visited, but masking costs nothing like it does on a
TPU's vector unit. Every table and plot names the device, the mode and the jax version.

Command line: `python -m svg_lib bench --preset small` (see `add_config_arguments`).
jax is imported inside functions, so importing this module (and `--help`) stays cheap.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import textwrap
import time
from dataclasses import dataclass

from svg_lib.attention import METHODS, b3_mask, build_attention
from svg_lib.methods import BASELINE, BLOG_SWEEP_METHOD, MethodPlans, check_method
from svg_lib.methods import METHODS as METHODS_TABLE
from svg_lib.methods import check_methods as table_check_methods
from svg_lib.core.masks import DENSE_LIMIT_TOKENS
from svg_lib.core.planner import PARTIAL, plan_tiles
from svg_lib.kernels.reference import masked_softmax_times_v, reference_attention
from svg_lib.kernels.splash import splash_mask_form
from svg_lib.memory.budget import check_memory
from svg_lib.problem import BLOG_SWEEP_V6E_MS, BLOG_V6E_MS, DEFAULT_METHODS, PRESETS, BenchConfig
from svg_lib.runtime import Runtime, default_interpret, detect_runtime

# Above this many heads x tokens^2 score elements, interpret mode runs for hours (the small
# preset is 2 x 10,080^2 = 2e8 and takes about a minute per dense call on a laptop core).
INTERPRET_WORK_LIMIT = 2e9


def blog_figure(config: BenchConfig, method: str) -> float | None:
    """The blog's v6e milliseconds for `method`, or None where it reports none.

    The figures are for the blog's own configuration (BQ 3328, BKV 1536); for B2 on the
    blog's problem with BKV 1536 and a BQ from its sweep, the sweep's figure is used.
    """
    check_method(method)
    if method == BLOG_SWEEP_METHOD and config.is_blog_problem and config.block_kv == 1536:
        if config.block_q in BLOG_SWEEP_V6E_MS:
            return BLOG_SWEEP_V6E_MS[config.block_q]
    return BLOG_V6E_MS.get(method)


def method_tiles(config: BenchConfig, method: str, plans=None) -> dict:
    """Tiles one call of `method` visits and masks, and its grid steps per head.

    dense, splash_dense: every tile, masking the key tiles that reach into padding;
    splash, b1, b2: the plan of the exact mask (b1, and Splash given a predicate, mask every
    visited tile); b3: the plan
    of the tile-aligned mask. `plans` (a `MethodPlans`) may be passed in to avoid replanning.
    """
    n, bq, bkv = config.tokens, config.block_q, config.block_kv
    nq, nk = -(-n // bq), -(-n // bkv)
    record = check_method(method)
    if not record.pallas:
        return {"tiles_total": nq * nk, "tiles_visited": None, "tiles_masked": None, "grid_steps": None}
    if record.dense:
        padded = nk * bkv != n
        return {"tiles_total": nq * nk, "tiles_visited": nq * nk, "tiles_masked": nq if padded else 0,
                "grid_steps": nq * nk}
    p = _method_plan(config, record, plans)
    visited = int(p.visited.sum())
    # the record says which tiles its kernel masks (B1: every visited one); Splash masks every
    # visited tile when its mask is a predicate
    masked = int((record.step_classes(p.classes) == PARTIAL).sum())
    if record.splash and splash_mask_form(config.mask(), n, nk * bkv) == "computable":
        masked = visited
    return {"tiles_total": nq * nk, "tiles_visited": visited, "tiles_masked": masked,
            "grid_steps": nq * p.steps}


def backward_steps(config: BenchConfig, method: str, plans=None) -> int | None:
    """Grid steps per head of `method`'s backward, as `attention()` runs it (`backward_form`).

    Fused: one pass over the transposed schedule (dense: every tile once). Split: the dq pass over
    the forward's schedule plus the dk/dv pass over its transpose (dense: every tile twice). None
    for Splash (its own fused backward kernel, whose skipping we do not count) and the reference.
    """
    n, bq, bkv = config.tokens, config.block_q, config.block_kv
    nq, nk = -(-n // bq), -(-n // bkv)
    record = check_method(method)
    if not record.backward:
        return None
    p = _method_plan(config, record, plans) if record.planned else None
    fused = backward_form(config, method, p) == "fused"
    if not record.planned:
        return nq * nk * (1 if fused else 2)
    transposed = nk * p.transposed_tables[0].shape[1]
    return transposed if fused else nq * p.steps + transposed


def _method_plan(config: BenchConfig, record, plans=None):
    """The plan `record`'s kernel walks at `config`'s blocks: `plans`' (a `MethodPlans`), else planned here."""
    if plans is not None:
        return plans.for_method(record)
    bq, bkv = config.block_q, config.block_kv
    return plan_tiles(record.computed_mask(config.mask(), bq, bkv), bq, bkv)


def backward_form(config: BenchConfig, method: str, plan=None) -> str:
    """"fused" or "split": which backward `attention()` runs for `method` at `config` on this machine's
    TPU (a v6e off TPU), decided as `build_attention` decides it (`memory.budget.check_memory`)."""
    q_len = -(-config.tokens // config.block_q) * config.block_q
    budget = check_memory(method, heads=config.heads, head_dim=config.head_dim, dtype=config.dtype,
                          block_q=config.block_q, block_kv=config.block_kv, block_kv_compute=config.block_kv_compute,
                          plan=plan, tables=None if plan is None else plan.tables, q_len=q_len)
    return budget.backward_form


def check_methods(methods) -> tuple[str, ...]:
    """`methods` (a name or several) as a tuple, each a known method listed once."""
    methods = table_check_methods((methods,) if isinstance(methods, str) else methods)
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods repeat: {', '.join(methods)}; list each once")
    return methods


def _is_interpret(interpret) -> bool:
    # interpret may be True/False or a pltpu.InterpretParams (which means interpret mode)
    return interpret is not False and interpret is not None


# Query rows the error check samples when the full reference is too big (see `error_rows`).
SAMPLED_ERROR_ROWS = 128


def sample_query_rows(tokens: int, rows: int, block_q: int):
    """`rows` query indices (fewer if `tokens` has fewer) spread evenly over `[0, tokens)`.

    The first and last query tiles (of `block_q` rows) each get at least two: the first tile holds
    the sink rows and the last one the padding edge, where a kernel most often goes wrong.
    Sorted and unique, int32.
    """
    import numpy as np

    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer (query rows to check), got {rows!r}")
    if rows >= tokens:   # as many rows asked as there are: all of them
        return np.arange(tokens, dtype=np.int32)
    last_tile = (tokens - 1) // block_q * block_q
    edges = [0, min(block_q, tokens) - 1, last_tile, tokens - 1]
    spread = np.linspace(0, tokens - 1, num=max(rows - len(edges), 1)).round().astype(np.int64)
    picked = np.unique(np.concatenate([np.asarray(edges, np.int64), spread]))
    return picked.astype(np.int32)


def sampled_reference(q, k, v, mask, rows):
    """Float32 reference attention for the query `rows` only: `[heads, len(rows), head_dim]`.

    Each query row's output depends on its own scores only, so restricting the reference to a
    few rows costs rows x tokens per head instead of tokens x tokens: cheap at any size.
    """
    import jax
    import jax.numpy as jnp

    rows = jnp.asarray(rows)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qs = q[:, rows].astype(jnp.float32) * scale
    s = jnp.einsum("hqd,hkd->hqk", qs, k.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    keep = None if mask is None else mask.keep(rows[:, None], jnp.arange(q.shape[1])[None, :])
    return masked_softmax_times_v(s, keep, v.astype(jnp.float32))


def run_benchmark(config: BenchConfig, methods=DEFAULT_METHODS, *, repeats: int = 3, warmup: int = 1,
                  check_error: bool = True, seed: int = 0, interpret=None, progress=None,
                  backward: bool = False, error_rows: int | None = None) -> "BenchResult":
    """Time each of `methods` on `config`'s problem; see the module docstring.

    q, k, v: `[heads, tokens, head_dim]` standard normal in `config.dtype` from
    `jax.random.key(seed)`. Per method: build (timed as `build_s`), compile (`compile_s`),
    `warmup` untimed calls, `repeats` timed calls (each until the result is ready). The
    error is the max |out - reference| with the reference in float32 under the mask the
    method computes (none for the dense methods, the rounded mask for b3); it is None when
    `check_error` is False. Up to 16,384 tokens every query row is checked; above that (a full
    reference would be too big) `SAMPLED_ERROR_ROWS` query rows spread over the sequence are, each
    against a reference computed for those rows only. `error_rows=n` forces that sampled check
    with n rows at any size. Each row records `error_rows`: how many query rows the error covers
    (`tokens` when all were checked), and `error_sampled`.
    `progress(line)` is called once per method as it finishes (e.g. `progress=print`).
    `interpret=None` runs compiled on a TPU, interpret mode elsewhere.

    With `backward`, each method is also timed forward + backward: `jax.grad` of
    `sum(out * dout)` with respect to q, k and v (`dout` standard normal), compiled ahead and
    timed like the forward (`train_median_ms`, `train_min_ms`); `backward_steps` counts the
    backward's grid steps per head and `grad_error` the max |dq, dk, dv - reference's|.
    """
    import jax
    import jax.numpy as jnp

    if not isinstance(config, BenchConfig):
        raise TypeError(f"config must be a BenchConfig (e.g. BenchConfig.from_preset('tiny')), "
                        f"got {type(config).__name__}")
    methods = check_methods(methods)
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if interpret is None:
        interpret = default_interpret()

    runtime = detect_runtime()
    mask = config.mask()
    bq, bkv = config.block_q, config.block_kv
    aligned = b3_mask(mask, bq, bkv)
    plans = MethodPlans(plan_tiles(mask, bq, bkv), plan_tiles(aligned, bq, bkv))
    dtype = jnp.dtype(config.dtype)
    keys = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, config.shape, dtype) for key in keys)

    dout = jax.random.normal(jax.random.fold_in(keys[0], 1), config.shape, dtype)
    if error_rows is not None and (isinstance(error_rows, bool) or not isinstance(error_rows, int)
                                   or error_rows < 1):
        raise ValueError(f"error_rows must be a positive integer (query rows to check) or None, got {error_rows!r}")
    sampled = error_rows is not None or config.tokens > DENSE_LIMIT_TOKENS
    rows_checked = (sample_query_rows(config.tokens, error_rows or SAMPLED_ERROR_ROWS, bq) if sampled
                    else None)
    errors_possible = check_error and config.tokens <= DENSE_LIMIT_TOKENS and not sampled
    references = {}  # one float32 reference per mask and kind: ("none" | "exact" | "b3", "out" | "grad")

    def gradient(attend):  # (q, k, v, dout) -> (dq, dk, dv) of sum(attend(q, k, v) * dout)
        # dout is an argument, not a closed-over constant, which XLA would try to fold into the program
        return jax.grad(lambda a, b, c, d: jnp.sum(attend(a, b, c).astype(jnp.float32) * d.astype(jnp.float32)),
                        argnums=(0, 1, 2))

    def reference_for(method, kind="out"):
        which = {"all": "none", "tile_aligned": "b3", "exact": "exact"}[METHODS_TABLE[method].computes]
        if (which, kind) not in references:
            ref_mask = {"none": None, "exact": mask, "b3": aligned}[which]
            f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            attend = lambda a, b, c: reference_attention(a, b, c, ref_mask)  # noqa: E731
            if kind == "sampled":
                references[which, kind] = jax.jit(lambda a, b, c: sampled_reference(a, b, c, ref_mask,
                                                                                    rows_checked))(*f32)
            else:
                references[which, kind] = (jax.jit(attend)(*f32) if kind == "out"
                                           else jax.jit(gradient(attend))(*f32, dout))
        return references[which, kind]

    def timed(compiled, *args):
        args = args or (q, k, v)
        out = None
        for _ in range(warmup):
            out = jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = jax.block_until_ready(compiled(*args))
            times.append((time.perf_counter() - start) * 1e3)
        return out, times

    rows = []
    for method in methods:
        start = time.perf_counter()
        fn = build_attention(mask, method=method, heads=config.heads, tokens=config.tokens,
                             head_dim=config.head_dim, dtype=dtype, block_q=bq, block_kv=bkv,
                             block_kv_compute=config.block_kv_compute, interpret=interpret)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = fn.lower(q, k, v).compile()  # compile ahead, so no timed call pays for it
        compile_s = time.perf_counter() - start
        out, times = timed(compiled)
        max_error = None
        if errors_possible:
            diff = jnp.abs(out.astype(jnp.float32) - reference_for(method))
            max_error = float(jnp.max(diff))
        elif check_error and sampled:
            diff = jnp.abs(out[:, jnp.asarray(rows_checked)].astype(jnp.float32) - reference_for(method, "sampled"))
            max_error = float(jnp.max(diff))
        error_info = {"error_rows": None if max_error is None else (len(rows_checked) if sampled else config.tokens),
                      "error_sampled": max_error is not None and sampled}
        del compiled, out
        row = {"method": method, **method_tiles(config, method, plans),
               "build_s": build_s, "compile_s": compile_s, "median_ms": statistics.median(times),
               "min_ms": min(times), "times_ms": times, "speedup": None, "max_error": max_error,
               **error_info, "blog_v6e_ms": blog_figure(config, method)}
        if backward:
            grads, train_times = timed(jax.jit(gradient(fn)).lower(q, k, v, dout).compile(), q, k, v, dout)
            grad_error = None
            if errors_possible:
                grad_error = max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)))
                                 for g, r in zip(grads, reference_for(method, "grad")))
            row.update({"backward_steps": backward_steps(config, method, plans),
                        "train_median_ms": statistics.median(train_times), "train_min_ms": min(train_times),
                        "train_times_ms": train_times, "train_speedup": None, "grad_error": grad_error})
            del grads
        del fn
        rows.append(row)
        if progress is not None:
            err = "" if max_error is None else f", max error {max_error:.2e}"
            if row["error_sampled"]:
                err += f" (over {row['error_rows']} sampled query rows)"
            train = f"; forward + backward median {row['train_median_ms']:.1f} ms" if backward else ""
            progress(f"{method}: median {row['median_ms']:.1f} ms (min {row['min_ms']:.1f}) over {repeats} "
                     f"call{'s' if repeats != 1 else ''}; build {build_s:.2f} s, compile {compile_s:.2f} s{err}{train}")

    for key, speedup in (("median_ms", "speedup"), ("train_median_ms", "train_speedup")):
        base = next((r.get(key) for r in rows if r["method"] == BASELINE), None)
        if base is not None:
            for r in rows:
                r[speedup] = base / r[key]
    mode = "interpret" if _is_interpret(interpret) else "compiled"
    return BenchResult(config=config, runtime=runtime, rows=rows, mode=mode, repeats=repeats, warmup=warmup,
                       seed=seed, plan_stats=plans.mask.stats)


@dataclass
class BenchResult:
    """What `run_benchmark` measured: one row (a dict) per method; see `ROW_KEYS`."""

    config: BenchConfig
    runtime: object  # svg_lib.runtime.Runtime
    rows: list
    mode: str        # "compiled" or "interpret": how the kernels really ran
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    plan_stats: dict | None = None

    ROW_KEYS = ("method", "tiles_visited", "tiles_masked", "grid_steps", "build_s", "median_ms", "min_ms",
                "speedup", "max_error", "blog_v6e_ms")

    BACKWARD_KEYS = ("backward_steps", "train_median_ms", "train_min_ms", "train_speedup", "grad_error")

    @property
    def backward(self) -> bool:
        """Whether forward + backward was timed too (`run_benchmark(..., backward=True)`)."""
        return any("train_median_ms" in r for r in self.rows)

    @property
    def on_v6e(self) -> bool:
        """Whether these times come from compiled kernels on a TPU v6e (the blog's chip)."""
        return self.mode == "compiled" and getattr(self.runtime, "tpu_generation", None) == "v6e"

    @property
    def blog_label(self) -> str:
        return "blog v6e ms" if self.on_v6e else "blog v6e (for reference, not this device)"

    @property
    def device(self) -> str:
        """e.g. "tpu TPU v6 lite", or just "cpu" when the kind says no more than the platform."""
        r = self.runtime
        return r.platform if r.device_kind.lower() == r.platform else f"{r.platform} {r.device_kind}"

    def header(self) -> str:
        r = self.runtime
        return (f"bench on {self.device} | {self.mode} mode | jax {r.jax_version} | "
                f"{self.config.describe()}")

    def table(self, drop=()) -> str:
        """A fixed-width text table: header line, one line per method, then notes.

        `drop` names columns to leave out (by title, e.g. ("build s", "min ms")) for a narrower table;
        the header line and the notes wrap to the table's width.
        """
        def num(fmt, suffix=""):
            return lambda value: "-" if value is None else format(value, fmt) + suffix

        # (title, row key, width, formatter); the first column is left-aligned, the rest right
        if self.backward:
            return self._backward_table(num)
        cols = [("method", "method", 12, str), ("visited", "tiles_visited", 8, num(",d")),
                ("masked", "tiles_masked", 7, num(",d")), ("steps", "grid_steps", 7, num(",d")),
                ("build s", "build_s", 8, num(".2f")), ("median ms", "median_ms", 10, num(".1f")),
                ("min ms", "min_ms", 9, num(".1f")), ("vs B0", "speedup", 6, num(".2f", "x")),
                ("max error", "max_error", 9, num(".1e")),
                (self.blog_label, "blog_v6e_ms", len(self.blog_label), num(".2f"))]
        titles = [title for title, *_ in cols]
        unknown = [name for name in drop if name not in titles[1:]]
        if unknown:
            raise ValueError(f"cannot drop {unknown}: the columns that can be left out are {titles[1:]}")
        cols = [col for col in cols if col[0] not in drop]

        def line(cells):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, (_, _, w, _)) in enumerate(zip(cells, cols))).rstrip()

        rule = "  ".join("-" * w for *_, w, _ in cols)
        width = max(len(rule), 80)  # the header and notes wrap to the table's width (80 at least)
        lines = textwrap.wrap(self.header(), width=width, subsequent_indent="  ")
        lines += [line([title for title, *_ in cols]), rule]
        for row in self.rows:
            lines.append(line([fmt(row.get(key)) for _, key, _, fmt in cols]))
        lines.append(rule)
        c = self.config
        nq, nk = -(-c.tokens // c.block_q), -(-c.tokens // c.block_kv)
        build = " build s = planning, not compiling, not timed." if "build s" not in drop else ""
        notes = [f"tiles: {nq} x {nk} = {nq * nk:,} per head; visited, masked and steps (grid steps) are per "
                 f"head. vs B0 = splash_dense median / this median.{build} {self.repeats} timed call(s) after "
                 f"{self.warmup} warm-up."]
        sampled = sorted({r["error_rows"] for r in self.rows if r.get("error_sampled")})
        if any(r["max_error"] is not None for r in self.rows):
            over = (f" over {', '.join(map(str, sampled))} query rows sampled across the sequence (first and last "
                    f"tiles included), the reference computed for those rows only" if sampled else "")
            notes.append("max error: max |out - reference|, reference in float32 under the mask each method "
                         f"computes (dense ones: no mask; b3: the tile-rounded mask){over}.")
        else:
            notes.append("max error: not checked (check_error off).")
        if c.is_blog_problem and (c.block_q, c.block_kv) == (3328, 1536):
            same = "this problem and blocks"
        elif c.is_blog_problem:
            same = "this problem; B2 from the BQ sweep where it has this BQ"
        else:
            same = "a different problem from this one"
        where = "a TPU v6e like this one" if self.on_v6e else "one TPU v6e chip, not this device"
        notes.append(f"blog figures: the case study on {where}: 75,600 tokens x 10 heads x 128, bf16, "
                     f"BQ 3328, BKV 1536 ({same}).")
        if self.mode == "interpret":
            notes.append("interpret mode: the kernels run as an XLA loop on the host. Skipped tiles are really "
                         "skipped, but masking costs differ from a TPU's: these are not TPU times.")
        for note in notes:
            lines.extend(textwrap.wrap(note, width=width, subsequent_indent="  "))
        return "\n".join(lines)

    def _backward_table(self, num) -> str:
        cols = [("method", "method", 12, str), ("fwd steps", "grid_steps", 9, num(",d")),
                ("bwd steps", "backward_steps", 9, num(",d")), ("fwd ms", "median_ms", 8, num(".1f")),
                ("fwd+bwd ms", "train_median_ms", 10, num(".1f")), ("vs B0", "train_speedup", 6, num(".2f", "x")),
                ("grad error", "grad_error", 10, num(".1e"))]

        def line(cells):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, (_, _, w, _)) in enumerate(zip(cells, cols))).rstrip()

        rule = "  ".join("-" * w for *_, w, _ in cols)
        lines = [self.header(), line([title for title, *_ in cols]), rule]
        lines += [line([fmt(row.get(key)) for _, key, _, fmt in cols]) for row in self.rows]
        lines.append(rule)
        notes = ["fwd / bwd steps: grid steps per head of the forward, and of the backward as attention() runs it "
                 "(the fused kernel's walk of the transposed schedule; where a head's dq does not fit in VMEM, the "
                 "dq and dk/dv passes together; Splash: its own fused backward, not counted). fwd+bwd ms: one jax.grad call of "
                 "sum(out * dout) for q, k and v, forward included. vs B0 = splash_dense's fwd+bwd median / "
                 "this one. grad error: max |dq, dk, dv - the float32 reference's| under the mask each "
                 f"method computes. {self.repeats} timed call(s) after {self.warmup} warm-up. The case study "
                 "publishes no backward figures."]
        if self.mode == "interpret":
            notes.append("interpret mode: the kernels run as an XLA loop on the host; these are not TPU times.")
        for note in notes:
            lines.extend(textwrap.wrap(note, width=max(len(rule), 80), subsequent_indent="  "))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> dict:
        """Everything needed to redraw the table and plot, as JSON-ready values."""
        return {"config": self.config.to_json(), "runtime": dataclasses.asdict(self.runtime), "mode": self.mode,
                "repeats": self.repeats, "warmup": self.warmup, "seed": self.seed, "plan_stats": self.plan_stats,
                "rows": [dict(r) for r in self.rows],
                "blog": {"v6e_ms": BLOG_V6E_MS, "sweep_b2_v6e_ms": {str(k): v for k, v in BLOG_SWEEP_V6E_MS.items()},
                         "problem": PRESETS["blog"].to_json()}}

    @classmethod
    def from_json(cls, data: dict) -> "BenchResult":
        """Rebuild a result written by `to_json` (e.g. read back from `bench --json PATH`)."""
        return cls(config=BenchConfig.from_json(data["config"]), runtime=Runtime(**data["runtime"]),
                   rows=[dict(r) for r in data["rows"]], mode=data["mode"], repeats=data.get("repeats", 3),
                   warmup=data.get("warmup", 1), seed=data.get("seed", 0), plan_stats=data.get("plan_stats"))

    def plot(self, ax=None):
        """Bar chart of the median ms per method; the blog's v6e figures beside, where it has them.

        Off a v6e the blog's bars get their own y axis (right): they are another device and
        another problem size, so only their shape compares, not their height. Returns the Figure.
        """
        import matplotlib.pyplot as plt
        import numpy as np

        if ax is None:
            fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
        else:
            fig = ax.figure
        methods = [r["method"] for r in self.rows]
        x = np.arange(len(methods))
        ours = [r["median_ms"] for r in self.rows]
        blog = [r["blog_v6e_ms"] for r in self.rows]
        has_blog = any(b is not None for b in blog)
        width = 0.4 if has_blog else 0.6
        shift = width / 2 if has_blog else 0.0
        r = self.runtime
        mine_label = f"{self.device} ({self.mode})"
        bars = ax.bar(x - shift, ours, width, color="#0072b2", label=mine_label)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(x, methods)
        ax.set_ylabel(f"median ms per call, {mine_label}")
        handles = [bars]
        if has_blog:
            bx = [xi + shift for xi, b in zip(x, blog) if b is not None]
            bv = [b for b in blog if b is not None]
            blog_ax = ax if self.on_v6e else ax.twinx()
            blog_bars = blog_ax.bar(bx, bv, width, color="#e69f00", label="blog, TPU v6e (75,600 tokens)")
            blog_ax.bar_label(blog_bars, fmt="%.1f", fontsize=8)
            if blog_ax is not ax:
                blog_ax.set_ylabel("blog v6e ms (for reference, not this device)")
                blog_ax.set_ylim(0, max(bv) * 1.3)
            handles.append(blog_bars)
        ax.set_ylim(0, max(ours) * 1.3)  # room for the legend above the bars
        ax.legend(handles=handles, loc="upper center", ncol=2, fontsize=8)
        ax.set_title(f"attention per call: {self.device}, {self.mode} mode, jax {r.jax_version}\n"
                     f"{self.config.geometry.tokens:,} tokens x {self.config.heads} heads, blocks "
                     f"{self.config.block_q} x {self.config.block_kv}, {self.config.dtype}", fontsize=9)
        return fig
