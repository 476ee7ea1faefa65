"""One problem description: presets are BenchConfigs, and every tool takes one (svg_lib.problem)."""
import dataclasses

import pytest

from svg_lib import SVGMask, VideoGeometry
from svg_lib.problem import PALLAS_METHODS, PRESETS, BenchConfig, check_dtype, check_method, get_preset, resolve_problem
from svg_lib.instruments.tools.tuner import tune
from svg_lib.instruments.tpu.cost import TileCost, cost_model


def test_a_preset_is_a_bench_config_with_a_name():
    blog = get_preset("blog")
    assert isinstance(blog, BenchConfig) and blog.name == "blog"
    assert blog.is_blog_problem and not get_preset("small").is_blog_problem
    assert str(blog).startswith("blog: ") and blog.describe() in str(blog)
    # the name takes no part in equality: the same problem built by hand is equal
    by_hand = BenchConfig(VideoGeometry(21, 45, 80), 10, 128, 0.35, 3328, 1536)
    assert by_hand == blog and by_hand.name is None


def test_from_preset_keeps_the_name_only_while_nothing_changed():
    assert BenchConfig.from_preset("small").name == "small"
    assert BenchConfig.from_preset("small", block_q=512).name == "small"  # the preset's own value
    changed = BenchConfig.from_preset("small", heads=4)
    assert changed.name is None and changed.heads == 4 and changed != get_preset("small")
    assert BenchConfig.from_preset("small", frames=3).name is None
    with pytest.raises(ValueError, match="unknown BenchConfig field"):
        BenchConfig.from_preset("small", tiles=3)


def test_get_preset_takes_overrides_checked_like_from_preset():
    walk = get_preset("walkthrough", block_q=512, block_kv=128, density=0.25)
    assert walk == BenchConfig.from_preset("walkthrough", block_q=512, block_kv=128, density=0.25)
    assert (walk.block_q, walk.block_kv, walk.density, walk.name) == (512, 128, 0.25, None)
    assert walk.geometry == get_preset("walkthrough").geometry and get_preset("walkthrough").block_q == 256
    assert get_preset("walkthrough", block_q=256).name == "walkthrough"   # the preset's own value
    with pytest.raises(ValueError, match="multiple of 128"):
        get_preset("walkthrough", block_q=100)
    with pytest.raises(ValueError, match="unknown BenchConfig field"):
        get_preset("walkthrough", bq=512)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope", block_q=128)


def test_a_preset_is_checked_like_any_config():
    with pytest.raises(ValueError, match="density"):
        dataclasses.replace(PRESETS["tiny"], density=1.5)
    with pytest.raises(ValueError, match="multiple of 128"):
        dataclasses.replace(PRESETS["tiny"], block_q=100)


def test_a_config_refuses_float_blocks_and_unsupported_dtypes_in_one_line():
    with pytest.raises(ValueError, match=r"^block_q must be an int, got 128.0 \(a float\); pass the int 128$"):
        dataclasses.replace(PRESETS["tiny"], block_q=128.0)
    with pytest.raises(ValueError, match=r"^unsupported dtype 'float16'; the kernels take float32 or bfloat16$"):
        dataclasses.replace(PRESETS["tiny"], dtype="float16")


def test_check_method_names_the_valid_ones():
    assert check_method("b3") == "b3"
    assert check_method("b3", ("b2", "b3"), "stage") == "b3"
    for bad in ("b5", "", None, " b2", "reference"):
        with pytest.raises(ValueError, match=rf"^unknown method {bad!r}.*; valid: {', '.join(PALLAS_METHODS)}$"):
            check_method(bad)
    with pytest.raises(ValueError, match=r"did you mean 'b2'"):
        check_method("B2")
    with pytest.raises(ValueError, match=r"^unknown stage 'b1'; valid: b2, b3$"):
        check_method("b1", ("b2", "b3"), "stage")
    assert check_dtype("float32") == "float32"


def test_resolve_problem_takes_a_config_or_a_mask_with_its_fields():
    tiny = get_preset("tiny")
    mask, fields = resolve_problem(tiny, heads=None, head_dim=64)
    assert mask == tiny.mask() and fields == {"heads": tiny.heads, "head_dim": 64}  # a given value wins
    mask, fields = resolve_problem(tiny.mask(), needs=("heads",), heads=3)
    assert fields == {"heads": 3}
    with pytest.raises(TypeError, match="give heads"):
        resolve_problem(tiny.mask(), needs=("heads",), heads=None)
    with pytest.raises(TypeError, match="BenchConfig.*or an svg_lib Mask"):
        resolve_problem("tiny")


def test_the_tuner_takes_a_config_as_it_takes_its_mask_and_fields(tmp_path, monkeypatch):
    """One cache entry for both spellings: the config is read into the same problem."""
    monkeypatch.setenv("SVG_LIB_CACHE_DIR", str(tmp_path))
    tiny = dataclasses.replace(get_preset("tiny"), heads=1)
    run = dict(method="b2", candidates=[(128, 128)], repeats=1, warmup=0, progress=False)
    first = tune(tiny, **run)
    again = tune(tiny.mask(), heads=1, head_dim=tiny.head_dim, dtype=tiny.dtype, **run)
    assert not first.from_cache and again.from_cache
    assert again.problem == first.problem and first.problem["heads"] == 1


def test_the_cost_model_takes_a_config_as_it_takes_its_mask_and_blocks():
    small = get_preset("small")
    per_step = {"svg_lib": {"free": 100.0, "svg_masked": 250.0, "padding_masked": 180.0, "idle": 5.0},
                "splash": {"free": 110.0, "svg_masked": 300.0, "blocks": 130.0}}  # B0: keys padded here
    cost = TileCost("v6e", small.block_q, small.block_kv, 256, small.head_dim, per_step,
                    {"svg_lib": 1000.0, "splash": 900.0}, {}, {}, {})
    methods = ("splash_dense", "b2", "b3")
    by_config = cost_model(small, cost, methods=methods)
    by_mask = cost_model(SVGMask.spatial(small.geometry, small.density), cost, block_q=small.block_q,
                         block_kv=small.block_kv, heads=small.heads, methods=methods)
    assert by_config == by_mask and by_config["b3"] < by_config["splash_dense"]
    assert cost_model(small, cost, heads=1, methods=methods)["b2"] * small.heads == pytest.approx(by_config["b2"])
    with pytest.raises(TypeError, match="give block_q, block_kv"):
        cost_model(small.mask(), cost)
