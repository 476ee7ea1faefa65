"""Tests of the benchmark harness (svg_lib.instruments.tools.bench) and TPU lowering reports (svg_lib.instruments.tpu.lowering).

Kernels run at the tiny preset (384 tokens, 3 x 3 tiles) with one timed call, so the whole
file stays within a few tens of seconds on a 2-core CPU.
"""
import dataclasses
import json

import jax
import matplotlib
import pytest

matplotlib.use("Agg")

from svg_lib.attention import b3_mask  # noqa: E402
from svg_lib.instruments.tools.bench import BenchResult, backward_form, backward_steps, blog_figure, method_tiles, run_benchmark
from svg_lib.problem import BLOG_SWEEP_V6E_MS, BLOG_V6E_MS, DEFAULT_METHODS, BenchConfig
from svg_lib.cli import main  # noqa: E402
from svg_lib.core.geometry import VideoGeometry  # noqa: E402
from svg_lib.instruments.tpu.lowering import LoweringReport, lower_all, lower_for_tpu  # noqa: E402
from svg_lib.core.planner import plan_tiles  # noqa: E402
from svg_lib.runtime import Runtime, detect_runtime  # noqa: E402

ON_CPU = jax.devices()[0].platform == "cpu"
F32_TOL = 1e-5   # float32 kernels against a float32 reference: rounding only
BF16_TOL = 3e-2  # bfloat16 inputs, bf16 probabilities into the second matmul, bf16 output


@pytest.fixture(scope="module")
def tiny():
    return BenchConfig.from_preset("tiny")


@pytest.fixture(scope="module")
def result(tiny):
    lines = []
    res = run_benchmark(tiny, repeats=1, warmup=1, progress=lines.append)
    res.progress_lines = lines  # kept for the progress test
    return res


def rows_by_method(res):
    return {r["method"]: r for r in res.rows}


# -- BenchConfig ---------------------------------------------------------------------------

def test_config_from_preset_and_overrides():
    c = BenchConfig.from_preset("small")
    assert c.geometry == VideoGeometry(21, 16, 30) and c.tokens == 10_080
    assert (c.heads, c.head_dim, c.block_q, c.block_kv, c.dtype) == (2, 128, 512, 256, "bfloat16")
    o = BenchConfig.from_preset("small", heads=1, frames=3, block_q=256, dtype="float32", first_frame_sink=False)
    assert o.geometry == VideoGeometry(3, 16, 30) and o.shape == (1, 3 * 16 * 30, 128)
    assert (o.block_q, o.dtype) == (256, "float32")
    assert o.mask().sink_tokens == 0 and c.mask().sink_tokens == 16 * 30
    assert BenchConfig.from_preset("small", dtype=jax.numpy.bfloat16).dtype == "bfloat16"


@pytest.mark.parametrize("overrides, words", [
    ({"colour": "red"}, ["unknown BenchConfig field", "colour", "heads"]),
    ({"density": 0.0}, ["density", "(0, 1]"]),
    ({"block_q": 100}, ["block_q", "multiple of 128"]),
    ({"block_kv_compute": 384}, ["block_kv_compute", "divide"]),
    ({"dtype": "float16"}, ["dtype", "bfloat16"]),
    ({"heads": 0}, ["heads", "positive"]),
])
def test_config_rejects_bad_values(overrides, words):
    with pytest.raises(ValueError) as info:
        BenchConfig.from_preset("tiny", **overrides)
    for word in words:
        assert word in str(info.value)


def test_blog_figures():
    blog, small = BenchConfig.from_preset("blog"), BenchConfig.from_preset("small")
    assert blog.is_blog_problem and not small.is_blog_problem
    assert [blog_figure(blog, m) for m in DEFAULT_METHODS] == [78.70, None, None, 96.37, 54.12, 32.76]
    for bq, ms in BLOG_SWEEP_V6E_MS.items():
        assert blog_figure(BenchConfig.from_preset("blog", block_q=bq), "b2") == ms
    assert blog_figure(small, "b2") == BLOG_V6E_MS["b2"]  # the blog's own configuration's figure


def test_method_tiles_at_blog_size_are_analytic():
    c = BenchConfig.from_preset("blog")
    stats = plan_tiles(c.mask(), c.block_q, c.block_kv).stats
    t = {m: method_tiles(c, m) for m in DEFAULT_METHODS}
    assert t["dense"]["tiles_visited"] == t["splash_dense"]["tiles_visited"] == stats["tiles_total"] == 23 * 50
    assert t["dense"]["tiles_masked"] == 23  # 50 x 1536 > 75,600: the last key tile of each row is padded
    assert t["b2"]["tiles_visited"] == t["b1"]["tiles_visited"] == stats["tiles_visited"]
    assert t["b1"]["tiles_masked"] == t["b1"]["tiles_visited"]
    assert t["b2"]["tiles_masked"] == stats["tiles_masked"] < t["b1"]["tiles_masked"]
    assert t["b3"]["tiles_visited"] == stats["b3_tiles_visited"] < t["b2"]["tiles_visited"]
    assert t["b3"]["tiles_masked"] == stats["b3_tiles_masked"] < t["b2"]["tiles_masked"]


# -- run_benchmark -----------------------------------------------------------------------------

def test_rows_cover_every_method_with_positive_times(result):
    assert [r["method"] for r in result.rows] == list(DEFAULT_METHODS)
    for r in result.rows:
        assert set(BenchResult.ROW_KEYS) <= set(r)
        assert r["median_ms"] > 0 and 0 < r["min_ms"] <= r["median_ms"]
        assert len(r["times_ms"]) == 1
        assert r["build_s"] >= 0 and r["compile_s"] > 0


def test_tile_counts_are_those_of_the_plans(result, tiny):
    rows = rows_by_method(result)
    plan = plan_tiles(tiny.mask(), tiny.block_q, tiny.block_kv)
    b3_plan = plan_tiles(b3_mask(tiny.mask(), tiny.block_q, tiny.block_kv), tiny.block_q, tiny.block_kv)
    total = plan.stats["tiles_total"]
    assert total == 9  # tiny: 3 x 3 tiles of 128
    for m in ("dense", "splash_dense"):
        assert rows[m]["tiles_visited"] == total and rows[m]["grid_steps"] == total
        assert rows[m]["tiles_masked"] == 0  # 384 tokens are whole tiles: no key padding
    for m in ("splash", "b1", "b2"):
        assert rows[m]["tiles_visited"] == int(plan.visited.sum()) < total
    assert rows["b1"]["tiles_masked"] == rows["b1"]["tiles_visited"]
    assert rows["b2"]["tiles_masked"] == rows["splash"]["tiles_masked"] == int(plan.needs_mask.sum())
    assert 0 < rows["b2"]["tiles_masked"] < rows["b2"]["tiles_visited"]
    assert rows["b3"]["tiles_visited"] == int(b3_plan.visited.sum()) <= rows["b2"]["tiles_visited"]
    assert rows["b3"]["tiles_masked"] == 0  # rounded to whole tiles, no padding to mask


def test_errors_are_small_under_each_methods_own_mask(result):
    for r in result.rows:
        assert r["max_error"] is not None and 0 <= r["max_error"] < F32_TOL, r


def test_backward_is_timed_checked_and_counted():
    """--backward: forward + backward timed per method, gradients checked against the reference's,
    and the backward's grid steps those of the fused kernel's walk (the transposed schedule), which
    attention() runs at this size; the split form's are the forward's schedule plus its transpose."""
    config = BenchConfig(geometry=VideoGeometry(3, 8, 16), heads=1, head_dim=128, block_q=128, block_kv=256,
                         density=0.35, dtype="float32")
    res = run_benchmark(config, ("splash_dense", "dense", "b3"), repeats=1, warmup=0, backward=True)
    rows = rows_by_method(res)
    plan = plan_tiles(b3_mask(config.mask(), 128, 256), 128, 256)
    nq, nk = plan.grid
    assert backward_form(config, "b3", plan) == backward_form(config, "dense") == "fused"
    assert rows["b3"]["backward_steps"] == nk * plan.transposed_tables[0].shape[1]
    assert rows["dense"]["backward_steps"] == nq * nk and rows["splash_dense"]["backward_steps"] is None
    # a sequence too long for one head's dq in VMEM: the split form, both passes counted
    long = dataclasses.replace(config, geometry=VideoGeometry(21, 90, 160), block_q=512, block_kv=512)
    assert backward_form(long, "dense") == "split"
    lq, lk = -(-long.tokens // 512), -(-long.tokens // 512)
    assert backward_steps(long, "dense") == 2 * lq * lk
    for r in res.rows:
        assert r["train_median_ms"] > 0 and r["grad_error"] < F32_TOL * 10
    assert rows["splash_dense"]["train_speedup"] == 1.0
    table = res.table()
    assert "fwd+bwd ms" in table and "grad error" in table
    assert max(map(len, table.splitlines()[1:])) <= 100  # below the header line, the rows and notes


def test_error_check_in_bfloat16_and_switched_off(tiny):
    bf16 = dataclasses.replace(tiny, dtype="bfloat16")
    res = run_benchmark(bf16, ("b2", "b3"), repeats=1, warmup=0)
    for r in res.rows:
        assert 0 < r["max_error"] < BF16_TOL, r
        assert r["speedup"] is None  # no splash_dense to compare with
    off = run_benchmark(tiny, ("b3",), repeats=1, warmup=0, check_error=False)
    assert off.rows[0]["max_error"] is None
    assert "max error: not checked" in off.table()


def test_speedup_and_blog_columns(result):
    rows = rows_by_method(result)
    base = rows["splash_dense"]["median_ms"]
    assert rows["splash_dense"]["speedup"] == pytest.approx(1.0)
    for r in result.rows:
        assert r["speedup"] == pytest.approx(base / r["median_ms"])
        assert r["blog_v6e_ms"] == BLOG_V6E_MS.get(r["method"])


def test_progress_is_reported_per_method(result):
    assert len(result.progress_lines) == len(DEFAULT_METHODS)
    for method, line in zip(DEFAULT_METHODS, result.progress_lines):
        assert line.startswith(f"{method}: median") and "build" in line


def test_bad_arguments_raise(tiny):
    with pytest.raises(ValueError, match="unknown method"):
        run_benchmark(tiny, ("b4",))
    for f in (blog_figure, method_tiles):  # no None, no tile counts for a method that does not exist
        with pytest.raises(ValueError, match=r"^unknown method 'B3' \(did you mean 'b3'\?\); valid: reference, "):
            f(tiny, "B3")
    with pytest.raises(ValueError, match="repeats"):
        run_benchmark(tiny, ("b3",), repeats=0)
    with pytest.raises(TypeError, match="BenchConfig"):
        run_benchmark("tiny")


# -- table, JSON, plot ---------------------------------------------------------------------------

def test_table_names_device_mode_jax_and_problem(result):
    text = result.table()
    runtime = detect_runtime()
    header = text.splitlines()[0]
    assert runtime.device_kind in header and f"jax {jax.__version__}" in header
    assert f"{result.mode} mode" in header and "384 tokens" in header and "2 heads" in header
    for m in DEFAULT_METHODS:
        assert any(line.startswith(m + " ") for line in text.splitlines())
    if ON_CPU:
        assert result.mode == "interpret"
        assert "blog v6e (for reference, not this device)" in text


def test_table_drops_the_columns_asked(result):
    full, narrow = result.table(), result.table(drop=("build s", "min ms"))
    rule = lambda text: next(line for line in text.splitlines() if line.startswith("-"))
    assert len(rule(full)) - len(rule(narrow)) == (8 + 2) + (9 + 2)   # two columns and their gaps
    titles = next(line for line in narrow.splitlines() if line.startswith("method "))
    assert "build s" not in titles and "min ms" not in titles and "median ms" in titles
    assert "build s" not in narrow                                       # nor its note
    narrowest = result.table(drop=("build s", "min ms", result.blog_label))
    assert max(len(line) for line in narrowest.splitlines()) <= 80      # header and notes wrap to it
    for m in DEFAULT_METHODS:
        assert any(line.startswith(m + " ") for line in narrow.splitlines())
    with pytest.raises(ValueError, match="cannot drop \\['method'\\]"):
        result.table(drop=("method",))


def test_table_on_a_v6e_labels_the_blog_column_plainly(result):
    v6e = Runtime(platform="tpu", device_kind="TPU v6 lite", device_count=1, jax_version=jax.__version__,
                  compiled=True)
    on_tpu = dataclasses.replace(result, runtime=v6e, mode="compiled")
    text = on_tpu.table()
    assert "blog v6e ms" in text and "not this device" not in text
    assert "TPU v6 lite" in text.splitlines()[0] and "compiled mode" in text.splitlines()[0]


def test_json_round_trip(result):
    data = json.loads(json.dumps(result.to_json()))
    assert data == result.to_json()
    again = BenchResult.from_json(data)
    assert again.to_json() == data
    assert again.table() == result.table()
    assert data["runtime"]["jax_version"] == jax.__version__ and data["config"]["tokens"] == 384


def test_plot(result):
    import matplotlib.pyplot as plt

    fig = result.plot()
    try:
        ax = fig.axes[0]
        title = ax.get_title()
        runtime = detect_runtime()
        assert runtime.device_kind in title and result.mode in title and jax.__version__ in title
        ours = ax.patches[:len(result.rows)]
        assert [p.get_height() for p in ours] == pytest.approx([r["median_ms"] for r in result.rows])
        blog_heights = [p.get_height() for a in fig.axes for p in a.patches][len(result.rows):]
        assert blog_heights == pytest.approx([r["blog_v6e_ms"] for r in result.rows if r["blog_v6e_ms"]])
        assert [t.get_text() for t in ax.get_xticklabels()] == list(DEFAULT_METHODS)
    finally:
        plt.close(fig)


# -- command line: bench ---------------------------------------------------------------------------

def test_cli_bench_prints_the_table_and_writes_json(capsys, tmp_path):
    path = tmp_path / "bench.json"
    code = main(["bench", "--preset", "tiny", "--methods", "splash_dense,b3", "--repeats", "1",
                 "--warmup", "0", "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"jax {jax.__version__}" in out.splitlines()[0]
    assert any(line.startswith("b3 ") for line in out.splitlines())
    data = json.loads(path.read_text())
    assert [r["method"] for r in data["rows"]] == ["splash_dense", "b3"]
    assert data["rows"][1]["tiles_visited"] == method_tiles(BenchConfig.from_preset("tiny"), "b3")["tiles_visited"]
    assert BenchResult.from_json(data).table() in out
    assert "b3: median" in err  # progress goes to stderr, the table to stdout


@pytest.mark.skipif(not ON_CPU, reason="the refusal is for interpret mode on a CPU")
def test_cli_refuses_blog_on_cpu_without_force(capsys):
    code = main(["bench", "--preset", "blog"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    for words in ("hours", "--preset small", "lower --preset blog", "--force"):
        assert words in err


@pytest.mark.parametrize("argv, words", [
    (["--preset", "tiny", "--methods", "b2,b9"], ["--methods", "b9"]),
    (["--preset", "tiny", "--block-kv-compute", "256"], ["block_kv_compute", "divide"]),
    (["--frames", "3"], ["--height", "--preset"]),
    (["--preset", "tiny", "--repeats", "0"], ["--repeats"]),
])
def test_cli_bench_bad_input(capsys, argv, words):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    for word in words:
        assert word in err


# -- lowering ------------------------------------------------------------------------------------

def test_lower_for_tpu_tiny_all_methods(tiny):
    reports = lower_all(tiny)
    assert [r.method for r in reports] == ["dense", "splash_dense", "splash", "b1", "b2", "b3"]
    for r in reports:
        assert r.ok and r.error is None and r.stage is None, r.error
        assert r.custom_calls == 1 and r.module_bytes > 1000
        assert r.build_s >= 0 and r.lower_s > 0
        assert r.vmem_fits and 0 < r.vmem_bytes <= r.vmem_budget


def test_lower_reports_a_vmem_overflow_instead_of_crashing():
    # 8192 x 8192 tiles computed in one slice: ~1.4 GiB of f32 scores; lowering itself would pass,
    # which is exactly why the VMEM estimate must stop it
    big = BenchConfig.from_preset("tiny", block_q=8192, block_kv=8192, block_kv_compute=8192)
    report = lower_for_tpu(big, "b2")
    assert isinstance(report, LoweringReport)
    assert not report.ok and report.stage == "vmem" and not report.vmem_fits
    assert report.vmem_bytes > report.vmem_budget
    assert "overflows VMEM" in report.error and "fits" in report.error  # the refusal suggests a config
    assert "FAILED" in report.line()
    json.dumps(report.to_json())


def test_lower_rejects_methods_that_are_not_kernels(tiny):
    with pytest.raises(ValueError, match="reference"):
        lower_for_tpu(tiny, "reference")


def test_cli_lower_tiny(capsys, tmp_path):
    path = tmp_path / "lower.json"
    code = main(["lower", "--preset", "tiny", "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    lines = out.splitlines()
    for method in ("dense", "splash_dense", "splash", "b1", "b2", "b3"):
        assert any(line.startswith(method + " ") and " ok " in line for line in lines)
    assert "6 of 6 lowered" in out
    data = json.loads(path.read_text())
    assert all(r["ok"] and r["custom_calls"] == 1 for r in data["reports"])


def test_cli_lower_exits_nonzero_on_failure(capsys):
    code = main(["lower", "--preset", "tiny", "--block-q", "8192", "--block-kv", "8192",
                 "--block-kv-compute", "8192", "--methods", "b3,dense"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "FAILED: b3, dense" in out and out.count("overflows VMEM") == 2


# -- the sampled error check (used above 16,384 tokens, where a full reference is too big) -------

def test_sampled_rows_spread_over_the_sequence_and_hold_both_end_tiles():
    from svg_lib.instruments.tools.bench import sample_query_rows

    rows = sample_query_rows(75_600, 128, 3328)
    assert 64 <= len(rows) <= 256 and len(set(rows.tolist())) == len(rows) and (rows == sorted(rows)).all()
    assert rows[0] == 0 and rows[-1] == 75_599
    assert (rows < 3328).sum() >= 2 and (rows >= 75_600 // 3328 * 3328).sum() >= 2   # first and last tiles
    # spread: no gap between consecutive sampled rows is much wider than an even spacing
    assert max(b - a for a, b in zip(rows, rows[1:])) <= 2 * 75_600 / (len(rows) - 4)
    assert len(sample_query_rows(100, 1000, 128)) == 100   # more rows asked than there are: all of them
    with pytest.raises(ValueError, match="positive integer"):
        sample_query_rows(100, 0, 128)


def test_sampled_error_over_every_row_equals_the_full_check(tiny, result):
    full = rows_by_method(result)
    sampled = run_benchmark(tiny, ("dense", "b2", "b3"), repeats=1, warmup=0, error_rows=tiny.tokens)
    for r in sampled.rows:
        assert r["error_sampled"] and r["error_rows"] == tiny.tokens
        assert r["max_error"] == pytest.approx(full[r["method"]]["max_error"], abs=1e-6)
    assert all(r["error_sampled"] is False and r["error_rows"] == tiny.tokens for r in result.rows)
    assert "sampled across the sequence" in sampled.table()


def test_sampled_error_catches_wrong_kernels(tiny, monkeypatch):
    """Forced onto the sampled path at a small size: a kernel with a wrong last row, or one built for
    a narrower band, fails the check; the right kernel passes."""
    import importlib

    from svg_lib.core.svg_masks import SVGMask

    bench_module = importlib.import_module("svg_lib.instruments.tools.bench")   # where run_benchmark finds build_attention

    real_build = bench_module.build_attention
    ok = run_benchmark(tiny, ("b2",), repeats=1, warmup=0, error_rows=64)
    row = ok.rows[0]
    assert row["error_sampled"] and 64 - 4 <= row["error_rows"] <= 64 and row["max_error"] < F32_TOL

    def last_row_wrong(*args, **kwargs):
        fn = real_build(*args, **kwargs)
        return jax.jit(lambda q, k, v: fn(q, k, v).at[:, -1].add(1.0))

    monkeypatch.setattr(bench_module, "build_attention", last_row_wrong)
    bad = run_benchmark(tiny, ("b2",), repeats=1, warmup=0, error_rows=64).rows[0]
    assert bad["max_error"] == pytest.approx(1.0, abs=1e-3)

    def narrower_band(mask, **kwargs):   # the kernel of a band one lane-width narrower than the mask checked
        return real_build(SVGMask(mask.geometry, mask.band_width - 128, mask.sink_tokens), **kwargs)

    monkeypatch.setattr(bench_module, "build_attention", narrower_band)
    wrong = run_benchmark(tiny, ("b2",), repeats=1, warmup=0, error_rows=64).rows[0]
    assert wrong["max_error"] > 100 * F32_TOL


def test_above_the_dense_limit_the_error_is_sampled(monkeypatch, tiny):
    import svg_lib.instruments.tools.bench as bench

    # pretend the tiny problem is too big for a full reference: the check must sample, not vanish
    monkeypatch.setattr(bench, "DENSE_LIMIT_TOKENS", tiny.tokens - 1)
    row = run_benchmark(tiny, ("b3",), repeats=1, warmup=0).rows[0]
    assert row["error_sampled"] and row["max_error"] is not None and row["max_error"] < F32_TOL
    assert row["error_rows"] == len(bench.sample_query_rows(tiny.tokens, bench.SAMPLED_ERROR_ROWS, tiny.block_q))
