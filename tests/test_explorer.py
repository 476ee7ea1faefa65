"""The mask explorer, driven from code the way a reader's slider moves would drive it."""
import pytest

pytest.importorskip("ipywidgets")
import matplotlib  # noqa: E402

matplotlib.use("Agg")

from svg_lib import SVGMask, VideoGeometry, plan_tiles  # noqa: E402
from svg_lib.teaching import explorer as explorer_module  # noqa: E402
from svg_lib.teaching.explorer import CSS_CLASSES, EXPLORER_CLASS, mask_explorer  # noqa: E402
from svg_lib.core.svg_masks import TemporalMask  # noqa: E402
from svg_lib.methods import MethodPlans  # noqa: E402


@pytest.fixture
def explorer():
    return mask_explorer(VideoGeometry(6, 8, 16), density=0.35, block_q=128, block_kv=128)


def test_builds_with_a_first_picture_and_stable_handles(explorer):
    import ipywidgets

    assert isinstance(explorer, ipywidgets.VBox) and EXPLORER_CLASS in explorer._dom_classes
    for name, css in CSS_CLASSES.items():
        assert css in getattr(explorer, name)._dom_classes, name
    names = ("frames", "height", "width", "density", "block_q", "block_kv", "head_kind", "methods", "run_button")
    descriptions = {name: getattr(explorer, name).description for name in names}
    assert descriptions == {"frames": "frames", "height": "height", "width": "width", "density": "density",
                            "block_q": "block_q", "block_kv": "block_kv", "head_kind": "head kind",
                            "methods": "methods", "run_button": "Run and time"}
    assert explorer.block_q.step == 128 and explorer.block_kv.step == 128
    assert explorer.tile_map.value[:8] == b"\x89PNG\r\n\x1a\n"  # drawn without anyone touching a widget
    expected = plan_tiles(SVGMask.spatial(VideoGeometry(6, 8, 16), 0.35), 128, 128).stats
    assert explorer.plan.stats == expected
    assert f"<td>{expected['tiles_visited']:,}</td>" in explorer.stats.value
    assert set(explorer.methods.options) == {"dense", "splash_dense", "splash", "b1", "b2", "b3"}


def test_sliders_update_plan_stats_and_picture(explorer):
    before_png, before_html, n = explorer.tile_map.value, explorer.stats.value, explorer.updates
    assert explorer.plan.stats["tiles_total"] == 36  # 768 tokens: 6 x 6 tiles of 128
    explorer.block_q.value = 256
    assert explorer.updates == n + 1
    assert explorer.plan.block_q == 256 and explorer.plan.stats["tiles_total"] == 18
    assert explorer.tile_map.value != before_png and explorer.stats.value != before_html
    assert "3 x 6 = 18" in explorer.stats.value
    explorer.frames.value = 3
    assert explorer.plan.tokens == 3 * 8 * 16 and explorer.mask.geometry.frames == 3
    explorer.density.value = 0.6
    assert explorer.plan.stats == plan_tiles(SVGMask.spatial(VideoGeometry(3, 8, 16), 0.6), 256, 128).stats


def test_temporal_head_plans_the_permuted_band(explorer):
    spatial_stats = explorer.plan.stats
    spatial_png = explorer.tile_map.value
    explorer.head_kind.value = "temporal"
    assert isinstance(explorer.mask, TemporalMask)
    assert explorer.plan.mask is not explorer.mask and explorer.plan.stats == spatial_stats  # same band
    fm = explorer.frame_major_plan
    assert fm is not None and fm.visited.sum() >= explorer.plan.visited.sum()
    assert fm.needs_mask.sum() > explorer.plan.needs_mask.sum()  # strided diagonals cut far more tiles
    assert "frame-major (in-kernel)" in explorer.stats.value
    assert "temporal-major" in explorer.note.value and explorer.tile_map.value != spatial_png
    # past the live limit the frame-major plan is left out, and the note says why
    explorer.block_q.value = 1024
    explorer.block_kv.value = 1024
    explorer.height.value = 40  # 6 x 40 x 16 = 3,840 tokens
    explorer.frames.value = 14  # 8,960 tokens
    assert explorer.plan.tokens > explorer_module.FRAME_MAJOR_LIMIT_TOKENS
    assert explorer.frame_major_plan is None and "pair by pair" in explorer.note.value
    assert explorer.tile_map.value[:4] == b"\x89PNG"


def test_too_many_tiles_skips_the_picture_not_the_stats(explorer, monkeypatch):
    monkeypatch.setattr(explorer_module, "DRAW_LIMIT_TILES", 40)
    explorer.frames.value = 8  # 1,024 tokens: 8 x 8 = 64 tiles
    assert explorer.tile_map.value == b"" and "too many to draw" in explorer.note.value
    assert explorer.plan.stats["tiles_total"] == 64 and "8 x 8 = 64" in explorer.stats.value


def test_run_button_times_the_chosen_methods(explorer, monkeypatch):
    explorer.methods.value = ("b2",)
    explorer.run_button.click()  # what a reader's click does
    result = explorer.last_result
    assert result is not None and [r["method"] for r in result.rows] == ["b2"]
    assert result.config.geometry == explorer.geometry and result.config.block_q == explorer.block_q.value
    assert "b2" in explorer.run_output.value and "median ms" in explorer.run_output.value
    assert result.rows[0]["max_error"] < 1e-4
    assert not explorer.run_button.disabled
    explorer.methods.value = ()
    assert explorer.run_and_time() is None and "choose at least one" in explorer.run_output.value


def test_run_refuses_large_problems_off_tpu(explorer, monkeypatch):
    from svg_lib import detect_runtime

    if detect_runtime().compiled:
        pytest.skip("the size cap applies to interpret mode only")
    monkeypatch.setattr(explorer_module, "RUN_LIMIT_TOKENS", 500)
    explorer.last_result = None
    assert explorer.run_and_time() is None and explorer.last_result is None
    assert "limit 500" in explorer.run_output.value


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 128"):
        mask_explorer(block_q=100)
    with pytest.raises(ValueError, match="head_kind"):
        mask_explorer(head_kind="diagonal")
    with pytest.raises(ValueError, match="unknown method"):
        mask_explorer(methods=("reference",))
    with pytest.raises(TypeError, match="VideoGeometry"):
        mask_explorer(geometry=(3, 8, 16))


def test_sliding_tiles_show_the_window_and_its_plan(explorer):
    from svg_lib import SlidingTileMask

    g = VideoGeometry(6, 8, 16)
    spatial_png = explorer.tile_map.value
    assert explorer.sliding_controls.layout.display == "none" and not explorer.density.disabled
    explorer.head_kind.value = "sliding tiles"
    assert explorer.sliding_controls.layout.display is None and explorer.density.disabled
    assert (explorer.cube, explorer.window) == (explorer_module.DEFAULT_CUBE, explorer_module.DEFAULT_WINDOW)
    expected = plan_tiles(SlidingTileMask(g, (2, 4, 16), (3, 1, 1)), 128, 128)
    assert isinstance(explorer.mask, SlidingTileMask) and explorer.plan.mask is explorer.mask
    assert explorer.plan.stats == expected.stats
    assert (explorer.plan.classes == expected.classes).all()
    # 128-token cubes, one per tile, no padding: every tile is full or empty, and B3 runs it unchanged
    assert explorer.plan.stats["tiles_masked"] == 0 and explorer.plan.stats["tiles_visited"] == 18
    assert "2 x 4 x 16 = 128 tokens, 3 x 2 x 1 of them" in explorer.stats.value
    assert "<td>18</td>" in explorer.stats.value and "refused" not in explorer.stats.value
    assert "kept or skipped whole" in explorer.note.value
    assert explorer.tile_map.value[:4] == b"\x89PNG" and explorer.tile_map.value != spatial_png
    assert len(explorer.figure.axes) >= 2  # the window in frame-major order beside the plan

    # the window slider moves in odd steps and replans: 3 x 3 x 1 cubes reach every cube here
    assert explorer.window_rows.step == 2 and explorer.window_rows.max == 3
    explorer.window_rows.value = 3
    assert explorer.mask.window == (3, 3, 1) and explorer.plan.stats["tiles_visited"] == 36
    # a cube the blocks do not divide, with padding (8 rows in cubes of 3): B3 refuses, B2 plans it
    explorer.cube_rows.value = 3
    assert explorer.mask.layout.padding_tokens > 0 and not explorer.mask.aligned(128, 128)
    assert explorer.plan.stats == plan_tiles(SlidingTileMask(g, (2, 3, 16), (3, 3, 1)), 128, 128).stats
    assert explorer.plan.stats["b3_refused"] and "refused" in explorer.stats.value
    assert "do not divide" in explorer.note.value
    # sliders follow the geometry: fewer frames, and the window slider's range shrinks with the cubes
    explorer.frames.value = 2
    assert explorer.mask.layout.cubes[0] == 1 and explorer.window_frames.max == 3  # the value set stays
    # back to the spatial head: the sliding controls hide and the band returns
    explorer.head_kind.value = "spatial"
    assert isinstance(explorer.mask, SVGMask) and explorer.sliding_controls.layout.display == "none"


def test_sliding_tiles_are_not_timed_and_say_how(explorer):
    explorer.head_kind.value = "sliding tiles"
    explorer.methods.value = ("b3",)
    assert explorer.run_and_time() is None and "to_tile_major" in explorer.run_output.value


def test_bad_sliding_arguments():
    with pytest.raises(ValueError, match="window must be 3 odd positive integers"):
        mask_explorer(window=(2, 1, 1))
    with pytest.raises(ValueError, match="tile must be 3 positive integers"):
        mask_explorer(cube=(0, 4, 16))
    explorer = mask_explorer(head_kind="sliding tiles", cube=(1, 8, 16), window=(3, 1, 1))
    assert explorer.mask.tile == (1, 8, 16) and explorer.plan.stats["tiles_visited"] == 18


def test_the_explorer_prices_its_tiles_per_chip(explorer):
    """Beside the counts: VMEM per chip with its fit, SMEM, and B1-B3's simulated time on a v5e and a v6e."""
    from svg_lib.instruments.tpu.cost import load_reference, model_cycles
    from svg_lib.chips import clock_hz

    p = explorer.prices
    assert set(p["vmem"]) == set(p["source"]) == {"v5e", "v6e"} and set(p["ms"]) == {"b1", "b2", "b3"}
    html = explorer.stats.value
    for needle in ("v5e ms (simulated)", "v6e ms (simulated)", "VMEM (B1-B3, bfloat16)", "SMEM (schedule)",
                   "a simulation", f"{p['ms']['b3']['v6e']:.3f}"):
        assert needle in html, needle
    assert all(f"{e.total / 2**20:.1f} of {e.budget / 2**20:.0f} MiB fits" in html for e in p["vmem"].values())
    # 128 x 128 was not probed: below the smallest probed tile, so an extrapolation, with its fit error shown
    assert p["source"] == {"v5e": "extrapolated", "v6e": "extrapolated"} and "misses them by up to" in html
    # a probed size: the price is the committed probe's model, exactly
    explorer.block_q.value, explorer.block_kv.value = 512, 256
    p = explorer.prices
    assert p["source"] == {"v5e": "probed", "v6e": "probed"}
    plans = MethodPlans(explorer.plan, plan_tiles(explorer_module.b3_mask(explorer.plan.mask, 512, 256), 512, 256))
    for chip in ("v5e", "v6e"):
        cost = load_reference()["groups"]["after"][(chip, 512, 256)]
        assert p["ms"]["b3"][chip] == model_cycles("b3", cost, plans) / clock_hz(chip) * 1e3
    # more heads, more time: the price follows the explorer's heads
    many = mask_explorer(VideoGeometry(6, 8, 16), block_q=512, block_kv=256, heads=4)
    assert many.prices["ms"]["b2"]["v6e"] == pytest.approx(4 * p["ms"]["b2"]["v6e"])


def test_prices_reach_the_case_studys_size_without_an_n_by_n_array():
    from svg_lib.problem import get_preset
    from svg_lib.teaching.explorer import price_facts, tile_prices

    blog = get_preset("blog")
    exact = blog.mask()
    plan = plan_tiles(exact, 2048, 1024)      # not probed, inside the probed range: interpolated
    prices = tile_prices(MethodPlans(plan, plan_tiles(explorer_module.b3_mask(exact, 2048, 1024), 2048, 1024)), heads=blog.heads)
    assert prices["source"] == {"v5e": "interpolated", "v6e": "interpolated"}
    assert 0 < prices["fit_error"]["v6e"] < 0.25 and prices["fit_error"]["v5e"] < 1e-9   # v5e: two probes, a line
    assert all(prices["ms"]["b3"][c] < prices["ms"]["b2"][c] for c in ("v5e", "v6e"))   # fewer tiles, no masks
    facts = dict(price_facts(prices))
    assert "interpolated from 4 probed tile sizes" in facts["predicted ms"] and "a line through both" in facts["predicted ms"]


def test_run_and_time_times_a_learners_kernel(explorer, monkeypatch):
    import svg_lib.teaching.explorer as module

    built = []

    def builder(config):
        built.append(config)
        return lambda q, k, v: q          # a stand-in kernel: what matters is that it is the one timed

    monkeypatch.setattr(module, "run_benchmark", lambda config, methods, **kw: type(
        "R", (), {"table": lambda self: f"svg_lib's {', '.join(methods)}", "rows": []})())
    mine = mask_explorer(VideoGeometry(6, 8, 16), block_q=128, block_kv=128, methods=("b3",), kernels={"b3": builder})
    mine.run_and_time(repeats=1)
    assert len(built) == 1 and built[0].block_q == 128 and set(mine.your_ms) == {"b3"}
    assert "your b3: median" in mine.run_output.value and "svg_lib&#x27;s b3" in mine.run_output.value
    with pytest.raises(ValueError, match="kernels must map methods"):
        mask_explorer(kernels={"b9": builder})
