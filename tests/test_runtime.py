"""Tests of svg_lib.runtime: runtime detection, TPU generation names, and the presets."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
import svg_lib.chips as chips_module
from svg_lib.runtime import Runtime, default_interpret, detect_runtime
from svg_lib.problem import PRESETS, Preset, get_preset
from svg_lib.chips import parse_tpu_generation

ON_CPU = jax.devices()[0].platform == "cpu"


# -- runtime -------------------------------------------------------------------------------

def test_detect_runtime_matches_jax():
    r = detect_runtime()
    devices = jax.devices()
    assert r.platform == devices[0].platform
    assert r.device_count == len(devices)
    assert r.jax_version == jax.__version__
    assert r.compiled == (devices[0].platform == "tpu")
    assert r.mode == ("compiled" if r.compiled else "interpret")
    assert default_interpret() == (not r.compiled)


@pytest.mark.skipif(not ON_CPU, reason="checks what a CPU-only machine reports")
def test_runtime_on_cpu():
    r = detect_runtime()
    assert (r.platform, r.device_kind, r.compiled, r.mode) == ("cpu", "cpu", False, "interpret")
    assert r.tpu_generation is None
    assert default_interpret() is True
    banner = r.banner()
    assert "\n" not in banner
    assert f"jax {jax.__version__}" in banner
    assert "interpret" in banner and "cpu" in banner
    assert f"({r.device_count} device" in banner


def test_banner_on_a_tpu_says_compiled_and_generation():
    r = Runtime(platform="tpu", device_kind="TPU v6 lite", device_count=8, jax_version="0.10.2", compiled=True)
    assert r.mode == "compiled" and r.tpu_generation == "v6e"
    banner = r.banner()
    assert "compiled" in banner and "interpret" not in banner
    assert "v6e" in banner and "8 devices" in banner and "TPU v6 lite" in banner


def test_gpu_runs_kernels_in_interpret_mode():
    r = Runtime(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", device_count=1, jax_version="0.10.2",
                compiled=False)
    assert r.mode == "interpret" and r.tpu_generation is None
    assert "interpret" in r.banner() and "(1 device)" in r.banner()


def test_runtime_is_frozen():
    r = detect_runtime()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.platform = "tpu"


# Every device_kind jax reports (jax/_src/pallas/mosaic/tpu_info.py, chip_version_from_device_kind).
DEVICE_KINDS = [
    ("TPU v2", "v2"),
    ("TPU v3", "v3"),
    ("TPU v4", "v4"),
    ("TPU v4 lite", "v4i"),
    ("TPU v5 lite", "v5e"),
    ("TPU v5e", "v5e"),
    ("TPU v5", "v5p"),
    ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"),
    ("TPU v6e", "v6e"),
    ("TPU7", "v7"),
    ("TPU7x", "v7x"),
    ("TPU8i", "v8i"),
]
NOT_A_KNOWN_TPU = ["cpu", "NVIDIA H100 80GB HBM3", "", "TPU v9 lite", "TPU v6 pro", "TPU"]


@pytest.mark.parametrize("kind, generation", DEVICE_KINDS + [(k, None) for k in NOT_A_KNOWN_TPU])
def test_parse_tpu_generation(kind, generation):
    assert parse_tpu_generation(kind) == generation


@pytest.mark.parametrize("kind, generation", DEVICE_KINDS + [(k, None) for k in NOT_A_KNOWN_TPU])
def test_our_parser_alone_handles_every_generation(kind, generation, monkeypatch):
    # an older jax (our floor is 0.6.2) may have no chip_version_from_device_kind
    monkeypatch.setattr(chips_module, "_jax_chip_version", lambda device_kind: None)
    assert parse_tpu_generation(kind) == generation


def test_our_parser_agrees_with_jax_where_jax_has_one():
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    if not hasattr(tpu_info, "chip_version_from_device_kind"):
        pytest.skip("this jax has no chip_version_from_device_kind")
    for kind, generation in DEVICE_KINDS:
        chip = tpu_info.chip_version_from_device_kind(kind)
        assert chip is not None, kind
        assert generation.lstrip("v") == chip.value.lstrip("v"), kind
        assert chips_module._parse_device_kind(kind) == generation
    # every chip jax knows has a name here
    assert {c.value for c in tpu_info.ChipVersion} == set(chips_module._JAX_CHIP_NAMES)


def test_banner_on_an_unknown_tpu_names_no_generation():
    r = Runtime(platform="tpu", device_kind="TPU v9 lite", device_count=1, jax_version="0.10.2", compiled=True)
    assert r.tpu_generation is None
    assert "TPU v9 lite" in r.banner() and "compiled (Mosaic)" in r.banner()


# -- presets -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, shape, tokens", [
    ("tiny", (3, 8, 16), 384),
    ("small", (21, 16, 30), 10_080),
    ("blog", (21, 45, 80), 75_600),
])
def test_preset_tokens(name, shape, tokens):
    p = get_preset(name)
    g = p.geometry
    assert (g.frames, g.height, g.width, g.text_tokens) == (*shape, 0)
    assert p.tokens == math.prod(shape) == tokens
    assert p.shape == (p.heads, tokens, p.head_dim)


def test_blog_preset_is_the_case_study():
    p = get_preset("blog")
    assert (p.tokens, p.heads, p.head_dim, p.block_q, p.block_kv) == (75_600, 10, 128, 3328, 1536)
    assert p.density == 0.35 and p.dtype == "bfloat16"


def test_small_preset_keeps_the_blog_frame_count():
    assert get_preset("small").geometry.frames == get_preset("blog").geometry.frames


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_fields_are_usable(name):
    p = PRESETS[name]
    assert p.name == name
    assert p.block_q % 128 == 0 and p.block_kv % 128 == 0
    assert jnp.dtype(p.dtype) in (jnp.float32, jnp.bfloat16)
    mask = p.mask()
    assert isinstance(mask, SVGMask)
    assert mask.tokens == p.tokens and mask.density == p.density
    assert mask.sink_tokens == p.geometry.frame_tokens
    assert p.mask(first_frame_sink=False).sink_tokens == 0
    assert name in str(p)


def test_get_preset_rejects_unknown_names_and_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        get_preset("huge")
    message = str(info.value)
    assert "huge" in message
    assert all(name in message for name in ("tiny", "small", "blog"))


def test_preset_rejects_block_sizes_off_the_lane_width():
    with pytest.raises(ValueError, match="multiple of 128"):
        Preset(VideoGeometry(1, 8, 16), heads=1, head_dim=128, block_q=100, block_kv=128, density=0.5,
               dtype="float32", name="bad")


def test_tiny_preset_holds_every_tile_class():
    from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles

    p = get_preset("tiny")
    plan = plan_tiles(p.mask(), p.block_q, p.block_kv)
    assert set(np.unique(plan.classes)) == {EMPTY, PARTIAL, FULL}
