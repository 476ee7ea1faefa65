"""Tests of the frontier (svg_lib/instruments/tools/frontier.py) and `python -m svg_lib frontier`, on a small grid of knobs.

The planted heads are at the case study's 75,600 tokens (the cost model prices that size); a few
sampled rows and one or two knobs per mask keep this to seconds.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import VideoGeometry, structured_qkv
from svg_lib.layers.semantic import plan_from_orders, plan_recall
from svg_lib.layers.synthetic import KINDS

from svg_lib.chips import TARGETS
from svg_lib.cli import main
from svg_lib.instruments.tools.frontier import (MXUS_FOR_CLOCK, TARGET_RECALLS, TILES, _every_tile, cheapest, clock_hz, frontier,
                                   mask_points, matmul_cycles_per_pair, ms_per_all_pairs, pareto_front, plot)
from svg_lib.instruments.tpu.cost import load_reference, model_cycles
from svg_lib.methods import MethodPlans

SMALL = {"svg_b3": (0.2, 0.9), "radial": (0.2, 16.0), "sliding": ((1, 3, 3),), "pooled": (0.2, 0.9)}


@pytest.fixture(scope="module")
def result():
    return frontier(rows=8, knobs=SMALL)


def test_clock_makes_the_mxus_reach_the_spec_peak_and_no_probe_beats_it():
    for chip in ("v5e", "v6e"):
        t = TARGETS[chip]
        assert clock_hz(chip) * 2 * MXUS_FOR_CLOCK[chip] * t.mxu ** 2 == pytest.approx(t.bf16_tflops * 1e12)
    assert clock_hz("v5e") == pytest.approx(1.5e9, rel=0.01)
    # at that clock no committed matmul floor (the tile's two matmuls alone) runs above the peak
    for (chip, bq, bk), cost in load_reference()["groups"]["after"].items():
        floor = cost.per_step.get("svg_lib", {}).get("matmuls")
        if floor and chip in MXUS_FOR_CLOCK:
            flops = 4 * bq * bk * cost.head_dim
            assert flops / (floor / clock_hz(chip)) <= TARGETS[chip].bf16_tflops * 1e12


def test_points_cover_every_mask_tile_and_knob(result):
    got = {(pt["mask"], pt["block_q"]) for pt in result["points"]}
    assert got == {(m, bq) for m in SMALL for bq in (512, 3328)} - {("sliding", 3328)}  # no 3,328-token cube
    for pt in result["points"]:
        assert 0.0 < pt["recall"] <= 1.0 + 1e-9 and pt["density"] > 0
        assert set(pt["ms"]) == {"v5e", "v6e"} and all(ms > 0 for ms in pt["ms"].values())


def test_more_pairs_recall_more_and_cost_more(result):
    for mask in ("svg_b3", "radial", "pooled"):
        for bq in (512, 3328):
            lo, hi = sorted((pt for pt in result["points"] if pt["mask"] == mask and pt["block_q"] == bq),
                            key=lambda pt: pt["density"])
            assert hi["recall"] > lo["recall"] and hi["ms"]["v6e"] > lo["ms"]["v6e"]


def test_a_mask_that_keeps_everything_costs_dense(result):
    # radial with a huge decay keeps (almost) every tile: its time is within 5 % of the all-tiles plan
    heads, n = result["heads"], 75_600
    for pt in result["points"]:
        if pt["mask"] == "radial" and pt["knob"] == 16.0:
            assert pt["recall"] > 0.99
            cost = load_reference()["groups"]["after"]["v6e", pt["block_q"], pt["block_kv"]]
            every = heads * model_cycles("b3", cost, MethodPlans(tile_aligned=_every_tile(n, pt["block_q"], pt["block_kv"])))
            assert pt["ms"]["v6e"] == pytest.approx(every / clock_hz("v6e") * 1e3, rel=0.05)
            assert pt["ms"]["v6e"] <= every / clock_hz("v6e") * 1e3 * (1 + 1e-9)


def test_best_is_the_cheapest_point_at_or_above_each_recall(result):
    for chip, per_mask in result["best"].items():
        for mask, per_target in per_mask.items():
            for target in TARGET_RECALLS:
                ok = [pt for pt in result["points"] if pt["mask"] == mask and pt["recall"] >= target]
                best = per_target[target]
                if not ok:
                    assert best is None
                else:
                    assert best["ms"][chip] == min(pt["ms"][chip] for pt in ok)


def test_cheapest_per_tile_size_and_the_front(result):
    points = result["points"]
    for tiles in TILES:
        pt = cheapest(points, "v6e", 0.5, mask="radial", tiles=tiles)
        same = [p for p in points if p["mask"] == "radial" and (p["block_q"], p["block_kv"]) == tiles]
        assert pt in same and pt["ms"]["v6e"] == min(p["ms"]["v6e"] for p in same if p["recall"] >= 0.5)
    assert cheapest(points, "v6e", 1.5) is None                           # no recall above 1
    assert cheapest(points, "v6e", 0.9) == min((p for p in points if p["recall"] >= 0.9), key=lambda p: p["ms"]["v6e"])
    front = pareto_front([p for p in points if p["mask"] == "pooled"], "v5e")
    assert [p["ms"]["v5e"] for p in front] == sorted(p["ms"]["v5e"] for p in front)
    assert all(a["recall"] < b["recall"] for a, b in zip(front, front[1:]))


def test_a_pair_costs_more_at_small_tiles(result):
    per_pair, probe = ms_per_all_pairs(result["points"]), matmul_cycles_per_pair()
    small, big = TILES
    for chip in ("v5e", "v6e"):
        assert per_pair[chip, small] > per_pair[chip, big] > 0 and probe[chip, small] > probe[chip, big] > 0
        # the all-pairs estimate at the big tiles is near the plan that visits every tile
        assert per_pair[chip, big] == pytest.approx(result["dense_ms"][chip], rel=0.25)


def test_plot_draws_without_changing_the_backend(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    fig_result = frontier(rows=4, knobs={"radial": (0.2, 16.0)}, masks=("radial",))
    fig = plot(fig_result, tmp_path / "f.png")
    assert matplotlib.get_backend() == before and len(fig.axes) == 2
    assert (tmp_path / "f.png").stat().st_size > 10_000
    from matplotlib.figure import Figure

    axes = Figure().subplots(1, 2)
    assert plot(fig_result, axes=axes) is axes[0].figure and all(ax.lines for ax in axes)   # drawn into the axes given
    with pytest.raises(ValueError, match="give 2 axes, got 1"):
        plot(fig_result, axes=axes[:1])


def test_calibration_sets_the_model_beside_the_blog(result):
    cal = result["calibration"]
    assert set(cal) == {"splash_dense", "b2", "b3"}
    assert cal["b3"]["blog_ms"] == 32.76 and cal["splash_dense"]["blog_ms"] == 78.70
    assert cal["b3"]["model_ms"] < cal["b2"]["model_ms"] < cal["splash_dense"]["model_ms"]  # the blog's order


def test_cli_prints_the_table_and_draws_the_plot(tmp_path, capsys):
    path = tmp_path / "frontier.png"
    assert main(["frontier", "--rows", "4", "--masks", "radial", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cheapest point reaching each mean recall" in out and "calibration" in out and "radial" in out
    assert path.stat().st_size > 10_000
    assert main(["frontier", "--masks", "nonsense"]) == 2


def test_semantic_point_clusters_once_and_recalls_what_its_plan_keeps():
    # semantic tiles are not in the default run (minutes of k-means at 75,600 tokens): a small problem
    g = VideoGeometry(4, 8, 32)
    q, k, _ = structured_qkv(g, list(KINDS), head_dim=32, seed=1)
    rows = np.arange(0, g.tokens, 8)
    s = jnp.einsum("hrd,hkd->hrk", q[:, rows], k, precision=jax.lax.Precision.HIGHEST) / np.sqrt(32)
    p = np.asarray(jax.nn.softmax(s, axis=-1), np.float64)
    cache = {}
    low = mask_points("semantic", 0.25, g, p, rows, q, k, 256, 128, cache)
    orders = cache["semantic", 256, 128]
    high = mask_points("semantic", 0.75, g, p, rows, q, k, 256, 128, cache)
    assert cache["semantic", 256, 128] is orders                   # clustered once per tile size
    assert (high[0] >= low[0] - 1e-12).all() and high[0].mean() > low[0].mean()
    assert low[2] == pytest.approx(2 / 8) and high[2] == pytest.approx(6 / 8)  # whole tiles: 2 and 6 of 8
    plan = plan_from_orders(q, k, *orders, block_q=256, block_kv=128, steps=2)
    np.testing.assert_allclose(low[0], np.asarray(plan_recall(q, k, plan, rows)), rtol=1e-5)
