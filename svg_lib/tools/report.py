"""The report a reader with a TPU runs and shares: `python -m svg_lib report`.

Nothing in this series has run on a TPU: every cycle count is the compiler's static profile,
every timing an interpreter's. The first reader with one can change that in a few minutes. The
report, on whatever jax finds:

1. times B0-B3 (`run_benchmark`), each output checked against a float32 reference on sampled
   query rows (all rows at small sizes);
2. runs the adversarial inputs (`kernels.adversarial`: scores at their bound, up to 1e10) through
   dense and B3 at head_dim 64, 128 and 256 in float32 and bfloat16: finite and exact, or not;
3. measures the bounded max's pass rate (`layers.profiling.bound_pass_rate`) on the benchmark's
   random q, k and on planted heads (`layers.synthetic.structured_qkv`);
4. sets the measured milliseconds beside the cost model's simulated cycles for that chip where the
   committed reference has its tiles (`tpu.cost`), and divides one by the other: nanoseconds per
   simulated cycle, per method. Equal across methods means the model ranks them as the chip does;
   the ratio to the chip's clock says how much the static profile leaves out;
5. writes `report.json`, `report.md` and `report.png` into one folder.

On a TPU it runs the blog's problem compiled; elsewhere the walkthrough's in interpret mode, and
every page says which. Sizes are the caller's to change (`config`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from svg_lib.attention import b3_mask, build_attention
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.kernels.adversarial import CASES, adversarial_heads
from svg_lib.kernels.reference import attention_float64
from svg_lib.kernels.tolerances import tolerance
from svg_lib.layers.profiling import bound_pass_rate
from svg_lib.layers.synthetic import structured_qkv
from svg_lib.problem import PRESETS, BenchConfig
from svg_lib.progress import bar as progress_bar
from svg_lib.runtime import default_interpret, detect_runtime
from svg_lib.tools.bench import run_benchmark
from svg_lib.tpu.cost import BLOCKS_KIND, cost_model, filled_from, load_reference

METHODS = ("splash_dense", "b1", "b2", "b3")
LABELS = {"splash_dense": "B0 dense Splash", "b1": "B1 naive", "b2": "B2 full/edge", "b3": "B3 tile-aligned"}
ADVERSARIAL_METHODS = ("dense", "b3")
ADVERSARIAL_HEAD_DIMS = (64, 128, 256)
ADVERSARIAL_DTYPES = ("float32", "bfloat16")
PLANTED_KINDS = ("spatial", "temporal", "local3d")


def default_config(runtime=None) -> BenchConfig:
    """The blog's problem on a TPU, the walkthrough's elsewhere (interpret mode would take hours)."""
    runtime = runtime or detect_runtime()
    return PRESETS["blog"] if runtime.compiled else PRESETS["walkthrough"]


def adversarial_rows(*, interpret=None, head_dims=ADVERSARIAL_HEAD_DIMS, dtypes=ADVERSARIAL_DTYPES,
                     methods=ADVERSARIAL_METHODS) -> list[dict]:
    """One row per (method, head_dim, dtype): the `kernels.adversarial` heads (256 tokens, 128-token
    tiles) through `method`, against a float64 reference: finite, max error, and the dtype's tolerance."""
    import jax.numpy as jnp

    interpret = default_interpret() if interpret is None else interpret
    mask = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.35)  # 256 tokens, as the heads have
    rows = []
    for head_dim in head_dims:
        q64, k64, v64 = adversarial_heads(head_dim, tokens=mask.tokens)
        for dtype in dtypes:
            q, k, v = (jnp.asarray(x, dtype) for x in (q64, k64, v64))
            for method in methods:
                kernel_mask = None if method == "dense" else mask
                f = build_attention(kernel_mask, method=method, heads=q.shape[0], tokens=mask.tokens,
                                    head_dim=head_dim, dtype=q.dtype, block_q=128, block_kv=128, interpret=interpret)
                got = np.asarray(jnp.asarray(f(q, k, v), jnp.float32), np.float64)
                # float64 from the inputs as the kernel got them (rounded to dtype), under its mask
                want = attention_float64(q, k, v, None if method == "dense" else b3_mask(mask, 128, 128))
                tol = tolerance(dtype)
                finite = bool(np.isfinite(got).all())
                err = float(np.abs(got - want).max()) if finite else float("nan")
                exact = finite and bool(np.all(np.abs(got - want) <= tol["atol"] + tol["rtol"] * np.abs(want)))
                rows.append({"method": method, "head_dim": head_dim, "dtype": dtype, "heads": len(CASES),
                             "finite": finite, "max_error": err, "within_tolerance": exact, **tol})
    return rows


def pass_rates(config: BenchConfig, *, seed: int = 0) -> dict:
    """The bounded max's pass rate per method (dense, b1-b3), on the benchmark's random q, k (the same
    seed) and on planted heads of `config`'s geometry, one head per kind of `PLANTED_KINDS`."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(seed), 3)
    q, k = (np.asarray(jax.random.normal(key, config.shape, jnp.dtype(config.dtype)).astype(jnp.float32))
            for key in keys[:2])
    pq, pk, _ = structured_qkv(config.geometry, PLANTED_KINDS, config.head_dim, seed=seed)
    mask = config.mask()
    out = {}
    for name, (qq, kk) in (("random", (q, k)), ("planted", (np.asarray(pq), np.asarray(pk)))):
        out[name] = {m: [float(x) for x in bound_pass_rate(qq, kk, mask, method=m, block_q=config.block_q,
                                                           block_kv=config.block_kv)]
                     for m in ("dense", "b1", "b2", "b3")}
    out["planted_kinds"] = list(PLANTED_KINDS)
    return out


def modelled_cycles(config: BenchConfig, target: str | None) -> dict | None:
    """The cost model's simulated cycles of `METHODS` on `target` at `config`'s tiles, from the committed
    reference; None where it has no entry for that chip and those tiles. Where Splash's block-mask
    body was not simulated (a v5e), B0 is priced at its mask-free body (a lower bound), and said."""
    if target is None:
        return None
    reference = load_reference()
    cost = reference["groups"]["after"].get((target, config.block_q, config.block_kv))
    if cost is None:
        return None
    lower_bound = BLOCKS_KIND not in cost.per_step.get("splash", {})
    model = cost_model(config, filled_from(cost, blocks_as_free=True) if lower_bound else cost, methods=METHODS)
    return {"target": target, "cycles": {m: model[m] for m in METHODS}, "b0_lower_bound": lower_bound,
            "versions": reference["versions"], "evidence": reference["evidence"]}


REPORT_STEPS = len(METHODS) + 3  # each stage timed, the adversarial inputs, the pass rates, the files


def run_report(out_dir, *, config: BenchConfig | None = None, repeats: int = 3, warmup: int = 1, seed: int = 0,
               progress=None, bar: bool = False) -> dict:
    """Run the report's steps (see the module docstring) and write report.json, report.md and report.png
    into `out_dir`. Returns the JSON object. `progress(line)` gets a line per step; `bar` shows a
    progress bar (`svg_lib.progress`: stderr, silenced by --quiet) naming the step that runs."""
    runtime = detect_runtime()
    config = config or default_config(runtime)
    shown = progress_bar(total=REPORT_STEPS, desc="report", show=bar)

    def say(line):
        if progress is not None:
            progress(line)
        if line.split(":")[0] in METHODS:  # a stage's timing is done
            shown.update(1)
            shown.set_description(f"report: timing B0-B3 ({shown.n} of {len(METHODS)} done)")

    started = time.perf_counter()
    say(f"report: {runtime.banner()}; {config.describe()}")
    shown.set_description("report: timing B0-B3")
    bench = run_benchmark(config, METHODS, repeats=repeats, warmup=warmup, seed=seed, progress=say)
    say("report: adversarial inputs (scores at their bound) through dense and B3")
    shown.set_description("report: adversarial inputs through dense and B3")
    adversarial = adversarial_rows()
    shown.update(1)
    say("report: the bounded max's pass rate")
    shown.set_description("report: the bounded max's pass rate")
    rates = pass_rates(config, seed=seed)
    shown.update(1)
    shown.set_description("report: writing report.json, report.md, report.png")
    target = runtime.tpu_generation
    model = modelled_cycles(config, target if runtime.compiled else None)
    # where nothing ran on a TPU, the reader still sees what the model predicts for the blog's v6e
    predicted = model or modelled_cycles(PRESETS["blog"], "v6e")
    calibration = None
    if model is not None:
        calibration = {r["method"]: r["median_ms"] * 1e6 / model["cycles"][r["method"]] for r in bench.rows}
    data = {"evidence": f"{bench.mode} on {bench.device}", "runtime": dataclasses.asdict(runtime),
            "mode": bench.mode, "config": config.to_json(), "bench": bench.to_json(), "adversarial": adversarial,
            "pass_rates": rates, "model": model, "model_for_blog_v6e": None if model else predicted,
            "ns_per_simulated_cycle": calibration, "seconds": time.perf_counter() - started}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "report.md").write_text(markdown(data, bench))
    figure = bench.plot()
    figure.savefig(out / "report.png", dpi=110)
    import matplotlib.pyplot as plt
    plt.close(figure)
    shown.update(1)
    shown.close()
    say(f"report: wrote {out / 'report.json'}, report.md and report.png")
    return data


def markdown(data: dict, bench) -> str:
    """The page to share: what ran where, the timings beside the model, the checks."""
    compiled = data["mode"] == "compiled"
    lines = [f"# svg_lib report: {bench.device}, {data['mode']}", "",
             f"jax {data['runtime']['jax_version']}; problem: {bench.config.describe()}.", ""]
    if not compiled:
        lines += ["No TPU here: the kernels ran in interpret mode on the CPU, so the timings say nothing about a "
                  "TPU (they follow the tiles visited only roughly). Run this on a TPU and share the folder.", ""]
    lines += ["## B0-B3", "", bench.table(), ""]
    model = data["model"]
    if model:
        lines += [f"## Measured against the static profile ({model['target']}, simulated cycles)", "",
                  "| stage | median ms | model cycles | ns per simulated cycle |", "|---|---:|---:|---:|"]
        for r in bench.rows:
            m = r["method"]
            lines.append(f"| {LABELS[m]} | {r['median_ms']:.2f} | {model['cycles'][m]:,.0f} | "
                         f"{data['ns_per_simulated_cycle'][m]:.3f} |")
        if model["b0_lower_bound"]:
            lines.append("\nB0's block-mask body was not simulated on this chip: its cycles are a lower bound.")
        lines.append("")
    elif data["model_for_blog_v6e"]:
        p = data["model_for_blog_v6e"]
        b0 = p["cycles"]["splash_dense"]
        lines += ["## What the static profile predicts for the blog's problem on a v6e (simulated, not measured)", "",
                  "| stage | model cycles | vs B0 |", "|---|---:|---:|"]
        lines += [f"| {LABELS[m]} | {c:,.0f} | {c / b0:.2f} |" for m, c in p["cycles"].items()]
        lines.append("")
    lines += ["## Adversarial inputs (scores at their bound)", "",
              "| method | head_dim | dtype | finite | max error | within tolerance |", "|---|---:|---|---|---:|---|"]
    lines += [f"| {r['method']} | {r['head_dim']} | {r['dtype']} | {r['finite']} | {r['max_error']:.2e} | "
              f"{r['within_tolerance']} |" for r in data["adversarial"]]
    rates = data["pass_rates"]
    lines += ["", "## The bounded max's pass rate (fraction of query tiles that take the bound)", "",
              "| inputs | dense | b1 | b2 | b3 |", "|---|---:|---:|---:|---:|"]
    for name in ("random", "planted"):
        lines.append(f"| {name} | " + " | ".join(f"{np.mean(rates[name][m]):.2f}" for m in ("dense", "b1", "b2", "b3"))
                     + " |")
    lines += ["", f"planted heads: one each of {', '.join(rates['planted_kinds'])}.", ""]
    return "\n".join(lines)
