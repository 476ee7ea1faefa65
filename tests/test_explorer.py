"""The mask explorer, driven from code the way a reader's slider moves would drive it."""
import pytest

pytest.importorskip("ipywidgets")
import matplotlib  # noqa: E402

matplotlib.use("Agg")

from svg_lib import SVGMask, VideoGeometry, plan_tiles  # noqa: E402
from svg_lib import explorer as explorer_module  # noqa: E402
from svg_lib.explorer import CSS_CLASSES, EXPLORER_CLASS, mask_explorer  # noqa: E402
from svg_lib.masks import TemporalMask  # noqa: E402


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
