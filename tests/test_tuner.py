"""The block-size tuner: candidates, measurements, the cache and the `tune` command (tiny sizes only)."""
import json
import time

import pytest

from svg_lib import SVGMask, b3_mask, get_preset, plan_tiles
from svg_lib.cli import main
from svg_lib.instruments.tools.tuner import cache_dir, check_candidates, default_candidates, tune
from svg_lib.instruments.tools.tune_result import TuneResult


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SVG_LIB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tune"


@pytest.fixture(scope="module")
def tiny_mask():
    return get_preset("tiny").mask()


def quiet(**kw):
    return dict(heads=1, head_dim=128, dtype="float32", repeats=1, warmup=1, progress=False, **kw)


def test_tune_measures_valid_candidates_and_caches(tiny_mask, private_cache):
    assert cache_dir() == private_cache
    cands = [(128, 128), (256, 128), (200, 128), (512, 128)]
    result = tune(tiny_mask, candidates=cands, **quiet())
    assert not result.from_cache
    assert [(r["block_q"], r["block_kv"]) for r in result.rows] == [(128, 128), (256, 128)]
    reasons = {(r["block_q"], r["block_kv"]): r["reason"] for r in result.rejected}
    assert "multiple of 128" in reasons[(200, 128)]
    assert "exceeds the 384 tokens" in reasons[(512, 128)]
    for row in result.rows:
        stats = plan_tiles(tiny_mask, row["block_q"], row["block_kv"]).stats
        assert row["masked_fraction"] == pytest.approx(stats["masked_fraction"])
        assert row["visited_fraction"] == pytest.approx(stats["visited_fraction"])
        assert row["grid_steps"] == stats["grid_steps"]
        assert row["median_ms"] > 0 and len(row["times_ms"]) == 1 and row["vmem_bytes"] > 0
    assert result.best["median_ms"] == min(r["median_ms"] for r in result.rows)
    text = result.table()
    assert "best: block_q=" in text and "rejected 200 x 128" in text and "interpret mode" in text
    files = list(private_cache.glob("*.json"))
    assert len(files) == 1

    start = time.perf_counter()
    again = tune(tiny_mask, candidates=cands, **quiet())
    assert time.perf_counter() - start < 1.0
    assert again.from_cache and again.rows == result.rows and again.rejected == result.rejected
    assert "(from cache)" in again.table()


def test_cache_key_tells_problems_apart(tiny_mask, private_cache):
    # candidates that are all rejected: nothing is timed, but the result is still cached by key
    bad = [(200, 128)]
    first = tune(tiny_mask, candidates=bad, **quiet())
    assert first.rows == [] and first.best is None and "no candidate could run here" in first.table()
    assert tune(tiny_mask, candidates=bad, **quiet()).from_cache
    other_density = SVGMask.spatial(get_preset("tiny").geometry, 0.5)
    assert not tune(other_density, candidates=bad, **quiet()).from_cache
    no_sink = SVGMask.spatial(get_preset("tiny").geometry, 0.35, first_frame_sink=False)
    assert not tune(no_sink, candidates=bad, **quiet()).from_cache
    assert not tune(tiny_mask, candidates=bad, **quiet(method="b3")).from_cache
    assert not tune(tiny_mask, candidates=bad, heads=2, head_dim=128, dtype="float32", repeats=1,
                    progress=False).from_cache
    assert not tune(tiny_mask, candidates=bad, cache=False, **quiet()).from_cache
    assert len(list(private_cache.glob("*.json"))) == 5  # cache=False wrote nothing


def test_masked_fraction_follows_the_method(tiny_mask):
    b1 = tune(tiny_mask, candidates=[(128, 128)], cache=False, **quiet(method="b1")).rows[0]
    assert b1["masked_fraction"] == 1.0  # B1 masks every tile it visits
    b3 = tune(tiny_mask, candidates=[(128, 128)], cache=False, **quiet(method="b3")).rows[0]
    aligned = plan_tiles(b3_mask(tiny_mask, 128, 128), 128, 128)
    assert b3["tiles_masked"] == int(aligned.needs_mask.sum()) == 0  # 384 tokens: no padding, whole tiles
    assert b3["visited_fraction"] == pytest.approx(aligned.visited.sum() / aligned.classes.size)


def test_check_candidates_reasons():
    valid, rejected = check_candidates([(128, 128), (256, 256), (256, 256, 384), (128, 128, 128), (128, 128)],
                                       tokens=384, head_dim=16384, method="b2", dtype="float32")
    assert valid == [(128, 128, None), (128, 128, 128)]  # the repeated (128, 128) is dropped
    reasons = [r["reason"] for r in rejected]
    assert "VMEM overflow" in reasons[0] and "MiB" in reasons[0]
    assert "must divide block_kv=256" in reasons[1]
    with pytest.raises(ValueError, match="block_q, block_kv"):
        check_candidates([(128,)], tokens=384, head_dim=128)


def test_default_candidates_scale_with_the_problem():
    assert default_candidates(384) == [(128, 128), (128, 256), (256, 128), (256, 256)]
    small = default_candidates(get_preset("small").tokens)  # 10,080 tokens
    sizes = sorted({bq for bq, _ in small})
    assert 2 <= len(sizes) <= 4 and all(s % 128 == 0 and s <= 10_112 for s in sizes)
    assert sizes[0] >= 10_112 // 64 and len(small) == len(sizes) ** 2


def test_bad_input(tiny_mask):
    with pytest.raises(ValueError, match="heads"):
        tune(tiny_mask, heads=0, head_dim=128)
    with pytest.raises(ValueError, match="method must be one of"):
        tune(tiny_mask, heads=1, head_dim=128, method="reference")
    with pytest.raises(TypeError, match="svg_lib Mask"):
        tune(None, heads=1, head_dim=128)
    with pytest.raises(ValueError, match="candidates is empty"):
        tune(tiny_mask, heads=1, head_dim=128, candidates=[])


def fake_result():
    rows = [{"block_q": bq, "block_kv": bkv, "block_kv_compute": None, "median_ms": ms, "min_ms": ms,
             "times_ms": [ms], "masked_fraction": mf, "visited_fraction": 0.5, "tiles_visited": 4, "tiles_masked": 1,
             "grid_steps": 6, "vmem_bytes": 2**20, "build_s": 0.0, "compile_s": 0.0}
            for bq, bkv, ms, mf in [(128, 128, 3.0, 0.1), (128, 256, 2.0, 0.4), (256, 128, 5.0, 0.3)]]
    runtime = {"platform": "cpu", "device_kind": "cpu", "jax": "x", "mode": "interpret"}
    problem = {"mask": {"tokens": 384}, "heads": 1, "head_dim": 128, "dtype": "float32"}
    return TuneResult("b2", problem, runtime, rows)


def test_plots_and_json_round_trip():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = fake_result()
    assert result.best["block_kv"] == 256 and result.least_masking["median_ms"] == 3.0
    assert "least masking (0.10 of visited tiles): 128 x 128" in result.table()
    assert "not the fastest" not in result.table() and "only compiled ones do" in result.table()  # interpret mode
    result.runtime["mode"] = "compiled"
    assert "128 x 128 at 3.00 ms - not the fastest" in result.table()
    result.runtime["mode"] = "interpret"
    fig = result.heatmap()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "block_kv" and ax.get_ylabel() == "block_q"
    cells = sorted(t.get_text() for t in ax.texts)
    assert cells == ["2.0", "3.0", "5.0"]  # one label per measured cell; (256, 256) was not measured
    plt.close(fig)
    fig = result.scatter()
    ax = fig.axes[0]
    assert "masked fraction" in ax.get_xlabel()
    assert sorted(tuple(p) for p in ax.collections[0].get_offsets()) == [(0.1, 3.0), (0.3, 5.0), (0.4, 2.0)]
    plt.close(fig)
    back = TuneResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.rows == result.rows and back.best == result.best


def test_cli_tune_in_process(tmp_path, capsys):
    out_json = tmp_path / "tune.json"
    argv = ["tune", "--preset", "tiny", "--heads", "1", "--dtype", "float32", "--block-q", "128",
            "--block-kv", "128,256", "--repeats", "1", "--json", str(out_json)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "best: block_q=128" in out and "block_kv" in out
    data = json.loads(out_json.read_text())
    assert sorted((r["block_q"], r["block_kv"]) for r in data["rows"]) == [(128, 128), (128, 256)]
    assert main(argv) == 0
    out2, err2 = capsys.readouterr()
    assert "from cache" in err2 and "(from cache)" in out2
    assert main(["tune", "--preset", "tiny", "--block-q", "12x"]) == 2
    assert "argument --block-q: expected comma-separated tile sizes" in capsys.readouterr().err
    from svg_lib import detect_runtime
    if not detect_runtime().compiled:  # on a TPU the blog size is a real (long) sweep: not for a unit test
        assert main(["tune", "--preset", "blog"]) == 2  # hours in interpret mode: refused with a hint
        assert "--force" in capsys.readouterr().err


# -- the TPU compiler as a check (libtpu) ----------------------------------------------------
# A problem on which a candidate passes every check of `check_candidates` but not the target's
# SMEM: 1440p (21 x 90 x 160 = 302,400 tokens) with 256 x 256 tiles, whose packed schedule
# (1,182 query tiles x ~500 steps) outgrows the 1 MiB of SMEM; 512 x 512 fits. build_attention
# refuses it before compiling (the SMEM estimate, checked against the compiler in test_smem.py).
SMEM_GEOMETRY = (21, 90, 160)


@pytest.fixture(scope="module")
def smem_mask():
    from svg_lib import VideoGeometry
    return SVGMask.spatial(VideoGeometry(*SMEM_GEOMETRY), 0.35)


def test_tune_drops_candidates_the_compiler_refuses(tpu_compiler, smem_mask, private_cache):
    from svg_lib.instruments.tools.tuner import compile_check

    refused, accepted = (256, 256), (512, 512)
    verdicts = [compile_check(smem_mask, method="b2", heads=1, head_dim=128, dtype="float32", block_q=bq,
                              block_kv=bkv, block_kv_compute=None, target="v6e") for bq, bkv in (refused, accepted)]
    assert [v["ok"] for v in verdicts] == [False, True] and verdicts[0]["stage"] == "smem"
    assert "overflows SMEM" in verdicts[0]["summary"] and verdicts[1]["compile_s"] > 0
    # tune with the target drops the refused candidate with the reason; timing the survivor in
    # interpret mode at 302,400 tokens would take hours, so only the check runs here
    from svg_lib.instruments.tools.tuner import _compile_filter
    rejected = []
    kept = _compile_filter([refused + (None,), accepted + (None,)], rejected, smem_mask, method="b2", heads=1,
                           head_dim=128, dtype="float32", target="v6e", cache=True, progress=False)
    assert kept == [accepted + (None,)] and [(r["block_q"], r["block_kv"]) for r in rejected] == [refused]
    reason = rejected[0]["reason"]
    assert reason.startswith("refused for v6e by the SMEM estimate") and "overflows SMEM" in reason
    # the verdicts are cached: asking again compiles nothing
    verdict = compile_check(smem_mask, method="b2", heads=1, head_dim=128, dtype="float32", block_q=512,
                            block_kv=512, block_kv_compute=None, target="v6e")
    assert verdict["from_cache"] and verdict["ok"]
    assert len(list((cache_dir() / "compile").glob("*.json"))) == 2
    # without a target both candidates pass: the refusal is the target's alone
    valid, rejected = check_candidates([refused, accepted], tokens=smem_mask.tokens, head_dim=128, method="b2",
                                       dtype="float32", generation="v6e")
    assert len(valid) == 2 and not rejected


def test_tune_target_bad_input(tiny_mask, capsys):
    with pytest.raises(ValueError, match="unknown TPU target 'v9'"):
        tune(tiny_mask, heads=1, head_dim=128, candidates=[(128, 128)], target="v9")
    assert main(["tune", "--preset", "tiny", "--block-q", "128", "--block-kv", "128", "--target", "v9"]) == 2
    assert "--target" in capsys.readouterr().err


def test_cli_tune_target(tpu_compiler, tmp_path, capsys):
    path = tmp_path / "tune.json"
    status = main(["tune", "--preset", "tiny", "--heads", "1", "--block-q", "128", "--block-kv", "128,384",
                   "--repeats", "1", "--warmup", "0", "--target", "v5e", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    data = json.loads(path.read_text())
    assert data["target"]["name"] == "v5e" and len(data["rows"]) == 2
    assert "compile-checked for v5e" in out


# -- the problem notebook 05 sweeps, chosen from the runtime ---------------------------------------

def _runtime(compiled, kind="cpu"):
    from svg_lib.runtime import Runtime

    return Runtime(platform="tpu" if compiled else "cpu", device_kind=kind, device_count=1, jax_version="0",
                   compiled=compiled)


def test_sweep_problem_in_interpret_mode_is_the_walkthrough_size():
    from svg_lib.instruments.tools.tuner import check_candidates, sweep_problem

    p = sweep_problem(_runtime(False))
    assert p.label == "walkthrough" and p.mask().tokens == 2520 and p.heads == 1 and p.dtype == "float32"
    assert len(p.candidates) == len(p.sizes) ** 2 + 2
    valid, rejected = check_candidates(p.candidates, tokens=p.geometry.tokens, head_dim=p.head_dim,
                                       dtype=p.dtype, generation="v6e")
    assert {(r["block_q"], r["block_kv"]) for r in rejected} == set(p.bad)   # the grid runs, the bad two do not
    # on a larger geometry the block_kv past the sequence moves with it: still refused, not run
    from svg_lib.problem import get_preset
    small = get_preset("small")
    q = p.at("small", small.geometry, small.density)
    assert q.label == "small" and q.mask().tokens == small.tokens and q.sizes == p.sizes
    valid, rejected = check_candidates(q.candidates, tokens=q.geometry.tokens, head_dim=q.head_dim,
                                       dtype=q.dtype, generation="v6e")
    assert {(r["block_q"], r["block_kv"]) for r in rejected} == set(q.bad) and q.bad != p.bad


def test_sweep_problem_on_a_tpu_is_blog_shaped_and_fits_a_v5e():
    from svg_lib.problem import get_preset
    from svg_lib.instruments.tools.tuner import check_candidates, sweep_problem

    blog = get_preset("blog")
    for kind, generation in (("TPU v5 lite", "v5e"), ("TPU v6 lite", "v6e")):
        p = sweep_problem(_runtime(True, kind))
        assert p.label == "blog" and p.geometry == blog.geometry and p.heads == blog.heads
        assert p.dtype == "bfloat16" and (blog.block_q, blog.block_kv) in p.candidates
        qkv_bytes = 3 * p.heads * p.geometry.tokens * p.head_dim * 2
        assert qkv_bytes < 16 * 2**30 / 20           # under a twentieth of a v5e's 16 GiB of HBM
        valid, rejected = check_candidates(p.candidates, tokens=p.geometry.tokens, head_dim=p.head_dim,
                                           dtype=p.dtype, generation=generation)
        # the bad two are refused on any chip, whatever size the problem is
        assert set(p.bad) <= {(r["block_q"], r["block_kv"]) for r in rejected}
        assert (blog.block_q, blog.block_kv, None) in valid
