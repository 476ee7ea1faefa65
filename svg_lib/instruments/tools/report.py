"""The report a reader with a TPU runs and shares: `python -m svg_lib report`.

The series' kernels were measured on a TPU v5e (svg_lib/data/tpu_measurements.json); a reader with
another chip adds what only that chip can tell in a few minutes. The report, on whatever jax finds:

1. times B0-B3 (`run_benchmark`), each output checked against a float32 reference on sampled
   query rows (all rows at small sizes);
2. runs the adversarial inputs (`kernels.adversarial`: scores at their bound, up to 1e10) through
   dense and B3 at head_dim 64, 128 and 256 in float32 and bfloat16: finite and exact, or not;
3. measures the bounded max's pass rate (`layers.profiling.bound_pass_rate`) on the benchmark's
   random q, k and on planted heads (`layers.synthetic.structured_qkv`), on the host in float64,
   every query tile (one BLAS matmul per tile: about 10 s a method on a 2-core CPU at the blog's size);
4. sets the measured milliseconds beside the cost model's simulated cycles for that chip where the
   committed reference has its tiles (`tpu.cost`), and divides one by the other: nanoseconds per
   simulated cycle, per method. Equal across methods means the model ranks them as the chip does;
   the ratio to the chip's clock says how much the static profile leaves out;
5. writes `report.json` (with svg_lib's version and commit, jax, jaxlib and libtpu, the chip and its
   device kind, the UTC date and the command line: `provenance`), `report.png` (time per stage, measured
   and simulated, one axis per chip, with the case study's figures where the chip is a v6e:
   `stage_figure`) and `report.md` (the page, the plot embedded, and where to send all three:
   `issues_url`) into one folder.

On a TPU it runs the blog's problem compiled; elsewhere the walkthrough's in interpret mode, and
every page says which. Sizes are the caller's to change (`config`).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from svg_lib.attention import build_attention
from svg_lib.chips import MXUS_FOR_CLOCK, clock_hz
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.environment import installed_version
from svg_lib.instruments.adversarial import CASES, adversarial_heads
from svg_lib.extensions.bounded_max import bound_test_on_device
from svg_lib.extensions.references import attention_float64
from svg_lib.extensions.tolerances import tolerance
from svg_lib.layers.profiling import bound_pass_rate
from svg_lib.layers.synthetic import structured_qkv
from svg_lib.methods import BASELINE, PLANNED_METHODS, SERIES_METHODS
from svg_lib.methods import METHODS as METHOD_TABLE
from svg_lib.problem import BLOG_V6E_MS, PRESETS, BenchConfig
from svg_lib.progress import bar as progress_bar
from svg_lib.runtime import default_interpret, detect_runtime
from svg_lib.instruments.tools.bench import run_benchmark
from svg_lib.instruments.tpu.cost import BLOCKS_KIND, cost_model, filled_from, load_reference

METHODS = (BASELINE,) + PLANNED_METHODS
LABELS = {"splash_dense": "B0 dense Splash", "b1": "B1 naive", "b2": "B2 full/edge", "b3": "B3 tile-aligned"}
ADVERSARIAL_METHODS = ("dense", "b3")
ADVERSARIAL_HEAD_DIMS = (64, 128, 256)
ADVERSARIAL_DTYPES = ("float32", "bfloat16")
PLANTED_KINDS = ("spatial", "temporal", "local3d")


PACKAGE = Path(__file__).resolve().parents[1]
TEMPLATE = "tpu-report.md"  # .github/ISSUE_TEMPLATE/tpu-report.md asks for the three files


def issues_url() -> str:
    """Where to send a report: the repository's new-issue page with the TPU report template, from the
    REPOSITORY_URL file of the checkout svg_lib runs from; the words "the repository's issues page"
    where there is none (an installed wheel) or it still holds its placeholder."""
    path = PACKAGE.parent / "REPOSITORY_URL"
    url = path.read_text().strip() if path.is_file() else ""
    if not url.startswith(("https://", "http://")):
        return "the repository's issues page"
    base = url.removesuffix(".git").rstrip("/")
    return f"{base}/issues/new?template={TEMPLATE}"


def git_commit() -> str | None:
    """The commit svg_lib's checkout is at ("+ local changes" when its files differ), or None when
    svg_lib does not run from a git checkout or git is missing."""
    try:
        head = subprocess.run(["git", "-C", str(PACKAGE), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(PACKAGE), "status", "--porcelain", "--untracked-files=no", "--",
                                "."], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def provenance(runtime, command: str | None = None) -> dict:
    """What a reader of a report needs to reproduce it: versions, commit, chip, date, command line."""
    return {"svg_lib": installed_version("svg-lib"), "git_commit": git_commit(),
            "jax": installed_version("jax"), "jaxlib": installed_version("jaxlib"),
            "libtpu": installed_version("libtpu"), "platform": runtime.platform,
            "chip": runtime.tpu_generation, "device_kind": runtime.device_kind,
            "device_count": runtime.device_count, "python": sys.version.split()[0],
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command if command is not None else " ".join(sys.argv)}


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
                kernel_mask = None if METHOD_TABLE[method].dense else mask
                f = build_attention(kernel_mask, method=method, heads=q.shape[0], tokens=mask.tokens,
                                    head_dim=head_dim, dtype=q.dtype, block_q=128, block_kv=128, interpret=interpret)
                got = np.asarray(jnp.asarray(f(q, k, v), jnp.float32), np.float64)
                # float64 from the inputs as the kernel got them (rounded to dtype), under its mask
                want = attention_float64(q, k, v, METHOD_TABLE[method].computed_mask(mask, 128, 128))
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
                     for m in SERIES_METHODS}
    out["planted_kinds"] = list(PLANTED_KINDS)
    out["computed"] = "on the device, float32 scores" if bound_test_on_device() else "on the host, float64 scores"
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
               progress=None, bar: bool = False, command: str | None = None) -> dict:
    """Run the report's steps (see the module docstring) and write report.json, report.md and report.png
    into `out_dir`. Returns the JSON object. `progress(line)` gets a line per step; `bar` shows a
    progress bar (`svg_lib.progress`: stderr, silenced by --quiet) naming the step that runs.
    `command`: the command line to record (default: this process's `sys.argv`)."""
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
    data = {"evidence": f"{bench.mode} on {bench.device}", "provenance": provenance(runtime, command),
            "runtime": dataclasses.asdict(runtime),
            "mode": bench.mode, "config": config.to_json(), "bench": bench.to_json(), "adversarial": adversarial,
            "pass_rates": rates, "model": model, "model_for_blog_v6e": None if model else predicted,
            "ns_per_simulated_cycle": calibration, "seconds": time.perf_counter() - started}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "report.md").write_text(markdown(data, bench))
    figure = stage_figure(data)
    figure.savefig(out / "report.png", dpi=110)
    import matplotlib.pyplot as plt
    plt.close(figure)
    shown.update(1)
    shown.close()
    say(f"report: wrote {out / 'report.json'}, report.md and report.png")
    return data


def stage_series(data: dict) -> list[dict]:
    """The plot's axes, one per chip: {"title", "series": {label: [ms per METHODS stage or None]}}.

    This device's axis holds the measured medians and, where the committed reference has this chip
    and these tiles, the static profile's simulated cycles at the chip's assumed clock
    (`chips.clock_hz`), and on a v6e the case study's milliseconds. Where nothing ran on a
    TPU, a second axis holds what the static profile simulates for the blog's problem on a v6e, beside
    the case study's figures for that same problem and chip."""
    rows = {r["method"]: r for r in data["bench"]["rows"]}
    platform, kind = data["runtime"]["platform"], data["runtime"]["device_kind"]
    device = kind if kind.lower() == platform else f"{platform} {kind}"
    config = BenchConfig.from_json(data["config"])
    measured = {f"measured ({data['mode']})": [rows[m]["median_ms"] if m in rows else None for m in METHODS]}
    axes = [{"title": f"{device}: {config.tokens:,} tokens x {config.heads} heads, {config.block_q} x "
                      f"{config.block_kv}", "series": measured}]

    def simulated(model):
        hz = clock_hz(model["target"]) if model["target"] in MXUS_FOR_CLOCK else None
        if hz is None:
            return {}
        label = f"simulated (static profile at an assumed {hz / 1e9:.2f} GHz)"
        return {label: [model["cycles"][m] / hz * 1e3 for m in METHODS]}

    case_study = {"case study (blog, measured on a v6e)": [BLOG_V6E_MS.get(m) for m in METHODS]}
    if data["model"]:
        axes[0]["series"].update(simulated(data["model"]))
        if data["model"]["target"] == "v6e" and config.is_blog_problem:
            axes[0]["series"].update(case_study)
    elif data["model_for_blog_v6e"]:
        blog = PRESETS["blog"]
        axes.append({"title": f"TPU v6e, not this machine: the blog's {blog.tokens:,} tokens x {blog.heads} heads, "
                              f"{blog.block_q} x {blog.block_kv}",
                     "series": {**simulated(data["model_for_blog_v6e"]), **case_study}})
    return axes


def stage_figure(data: dict):
    """Time per stage (B0-B3), one axis per chip, every series in ms on that axis (`stage_series`)."""
    import matplotlib.pyplot as plt

    axes_data = stage_series(data)
    fig, axes = plt.subplots(1, len(axes_data), figsize=(6.5 * len(axes_data), 4.2), layout="constrained",
                             squeeze=False)
    colors = {"measured": "#0072b2", "simulated": "#009e73", "case": "#e69f00"}  # one color per kind of number
    x = np.arange(len(METHODS))
    for ax, one in zip(axes[0], axes_data):
        width = 0.8 / len(one["series"])
        for i, (label, values) in enumerate(one["series"].items()):
            shown = [(xi + (i - (len(one["series"]) - 1) / 2) * width, v) for xi, v in zip(x, values) if v is not None]
            bars = ax.bar([p for p, _ in shown], [v for _, v in shown], width, label=label,
                          color=colors[label.split()[0]])
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        top = max(v for values in one["series"].values() for v in values if v is not None)
        ax.set_ylim(0, top * 1.35)  # room for the legend above the bars
        ax.set_xticks(x, [LABELS[m] for m in METHODS], fontsize=8)
        ax.set_ylabel("ms per attention call")
        ax.set_title(one["title"], fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(f"svg_lib report: {data['evidence']}, jax {data['runtime']['jax_version']}", fontsize=10)
    return fig


def markdown(data: dict, bench) -> str:
    """The page to share: what ran where, the timings beside the model, the checks, where to send it."""
    compiled = data["mode"] == "compiled"
    p = data.get("provenance") or {}
    lines = [f"# svg_lib report: {bench.device}, {data['mode']}", "",
             f"jax {data['runtime']['jax_version']}; problem: {bench.config.describe()}.", ""]
    if p:
        lines += [f"svg_lib {p['svg_lib'] or 'from its source folder'} (commit {p['git_commit'] or 'unknown'}), jax {p['jax']}, jaxlib "
                  f"{p['jaxlib']}, libtpu {p['libtpu'] or 'not installed'}; chip {p['chip'] or 'none'} "
                  f"({p['device_kind']}); {p['date_utc']}; command: `{p['command']}`", ""]
    lines += ["![Time per stage, measured and simulated, one axis per chip](report.png)", ""]
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
              "| inputs | " + " | ".join(SERIES_METHODS) + " |", "|---|" + "---:|" * len(SERIES_METHODS)]
    for name in ("random", "planted"):
        lines.append(f"| {name} | " + " | ".join(f"{np.mean(rates[name][m]):.2f}" for m in SERIES_METHODS)
                     + " |")
    lines += ["", f"planted heads: one each of {', '.join(rates['planted_kinds'])}; every query tile tested, "
              f"{rates['computed']}.", ""]
    lines += [f"Send report.json, report.md and report.png to {issues_url()} (a new issue, template \"TPU report\")."]
    return "\n".join(lines) + "\n"
