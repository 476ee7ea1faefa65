"""A chip's two TensorCores: heads split over a v7x's two devices, and balanced over a megacore's two cores.

* v7x: `attention()` and the routed layers split heads over the chip's two jax devices by default (`split_heads`),
  checked here on simulated CPU devices (a subprocess with two of them), and compiled for a v7x
  with libtpu (compile-only "tpu7x:1x1x1": one chip, two devices) to show each device's kernel
  running half the heads.
* v4 / v5p (megacore: two cores, one device, contiguous halves of the heads): the in-kernel routed
  layer orders heads so both halves get an equal share of each kind (`layers.routing.pair_swaps`).
"""
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import SVGMask, VideoGeometry
from svg_lib.chips import TARGETS, parallel_split
from svg_lib.layers.routing import (CompileCounter, balance_heads, balanced_order, build_svg_attention_in_kernel,
                                    megacore_balance, pair_swaps)
from svg_lib.problem import get_preset
from svg_lib.runtime import check_head_split, chip_devices, head_split_devices

REPO = Path(__file__).resolve().parents[1]


# -- chip facts ----------------------------------------------------------------------------------

def test_which_chips_show_their_cores_as_devices_and_which_are_megacores():
    assert {name for name, t in TARGETS.items() if t.devices_per_chip == 2} == {"v7x"}
    assert {name for name, t in TARGETS.items() if t.megacore} == {"v4", "v5p"}
    assert not TARGETS["v7x"].megacore and not TARGETS["v6e"].megacore


@pytest.mark.parametrize("extent,cores", [(10, 2), (7, 2), (1, 2), (9, 3)])
def test_parallel_split_is_contiguous_and_covers_the_axis(extent, cores):
    shares = parallel_split(extent, cores)
    assert len(shares) == cores
    assert [i for share in shares for i in share] == list(range(extent))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, "10"])
def test_parallel_split_refuses_bad_extents(bad):
    with pytest.raises(ValueError, match="extent must be a positive int"):
        parallel_split(bad)


# -- v7x: where attention() splits its heads -----------------------------------------------------

def test_off_a_v7x_nothing_is_split_by_default():
    q = jnp.zeros((4, 8, 128), jnp.float32)
    assert chip_devices() == (jax.devices()[0],)
    assert head_split_devices(q, 4) is None          # one CPU device: as before
    assert head_split_devices(q, 4, False) is None
    with pytest.raises(ValueError, match="needs a chip whose TensorCores jax shows as separate devices"):
        head_split_devices(q, 4, True)


def test_split_requests_that_cannot_work_are_refused_clearly():
    cpu = jax.devices()[0]
    with pytest.raises(ValueError, match="two or more distinct jax devices"):
        check_head_split([cpu], 4)
    with pytest.raises(ValueError, match="two or more distinct jax devices"):
        check_head_split([cpu, cpu], 4)
    with pytest.raises(TypeError, match="sequence of devices"):
        head_split_devices(jnp.zeros((4, 8, 128)), 4, "cores")
    with pytest.raises(TypeError, match="sequence of jax devices"):
        check_head_split(7, 4)


class _Core:
    """A stand-in for one TensorCore of a v7x (only what the split's checks read)."""
    platform = "tpu"

    def __init__(self, index):
        self.index = index


def test_the_default_splits_where_the_chip_shows_two_devices(monkeypatch):
    import svg_lib.runtime as runtime

    pair = (_Core(0), _Core(1))
    monkeypatch.setattr(runtime, "chip_devices", lambda device=None: pair)  # as on a v7x
    q = jnp.zeros((4, 8, 128), jnp.float32)
    assert head_split_devices(q, 4) == pair
    assert head_split_devices(q, 4, True) == pair
    assert head_split_devices(q, 4, False) is None       # the opt-out
    assert head_split_devices(q, 3) is None              # odd heads: one device, no error
    with pytest.raises(ValueError, match="3 heads do not split evenly over 2 devices"):
        head_split_devices(q, 3, True)

    # under a caller's trace, only where jax sees one chip's devices and no mesh of the caller's
    seen = []
    jax.jit(lambda x: seen.append(head_split_devices(x, 4)) or x)(q)
    assert seen == [None]   # this process has one device, not a v7x's two


SPLIT_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from svg_lib import SVGMask, VideoGeometry, attention
    from svg_lib.layers.routing import svg_attention, svg_attention_in_kernel
    from svg_lib.runtime import head_split_devices

    cores = tuple(jax.devices()[:2])
    assert len(cores) == 2, jax.devices()
    g = VideoGeometry(4, 8, 8)
    mask = SVGMask.spatial(g, 0.35)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((4, g.tokens, 32)), jnp.float32) for _ in range(3))
    blocks = dict(block_q=128, block_kv=128)
    for method in ("b3", "dense"):
        one = attention(q, k, v, mask, method=method, **blocks, split_heads=False)
        two = attention(q, k, v, mask, method=method, **blocks, split_heads=cores)
        # each device runs the same kernel on its own heads: bit for bit the one-device result
        np.testing.assert_array_equal(np.asarray(two), np.asarray(one))
        assert {s.device for s in two.addressable_shards} == set(cores)
        assert all(s.data.shape[0] == 2 for s in two.addressable_shards), [s.data.shape for s in two.addressable_shards]
        # inputs committed to one device come back on that device
        placed = [jax.device_put(x, cores[1]) for x in (q, k, v)]
        back = attention(*placed, mask, method=method, **blocks, split_heads=cores)
        assert back.sharding.device_set == {cores[1]} and back.committed
        np.testing.assert_array_equal(np.asarray(back), np.asarray(one))

        def loss(q, k, v, split):
            return jnp.sum(attention(q, k, v, mask, method=method, **blocks, split_heads=split) ** 2)
        g_one = jax.jit(jax.grad(lambda *a: loss(*a, False), argnums=(0, 1, 2)))(q, k, v)
        g_two = jax.jit(jax.grad(lambda *a: loss(*a, cores), argnums=(0, 1, 2)))(q, k, v)
        for a, b in zip(g_one, g_two):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        print(method, "ok")

    # the routed layers split the same way, the per-head flags split with the heads; the temporal
    # heads clustered in one half, so the layer gathers them into balanced halves and back
    flags = jnp.array([True, True, False, False])
    for layer in (svg_attention, svg_attention_in_kernel):
        one = layer(q, k, v, flags, mask, method="b2", **blocks, split_heads=False)
        options = [{}, {"balance_cores": False}] if layer is svg_attention_in_kernel else [{}]
        for balance in options:  # balanced halves (the default), and contiguous ones
            two = layer(q, k, v, flags, mask, method="b2", **blocks, split_heads=cores, **balance)
            np.testing.assert_array_equal(np.asarray(two), np.asarray(one))
        placed = [jax.device_put(x, cores[0]) for x in (q, k, v, flags)]
        assert layer(*placed, mask, method="b2", **blocks, split_heads=cores).sharding.device_set == {cores[0]}
    # what each device is handed: one temporal head each, by the flags at run time
    from svg_lib.layers.routing import balanced_order
    halves = np.asarray(flags)[np.asarray(balanced_order(flags))].reshape(2, 2)
    assert halves.sum(axis=1).tolist() == [1, 1], halves
    print("routed ok")

    # spread over devices by the caller already: the default leaves the placement alone
    mesh = Mesh(np.array(cores), ("x",))
    spread = jax.device_put(q, NamedSharding(mesh, P("x")))
    assert head_split_devices(spread, 4) is None
    # inside a caller's shard_map the default never splits
    seen = []
    jax.shard_map(lambda x: seen.append(head_split_devices(x, 2)) or x, mesh=mesh, in_specs=P("x"),
                  out_specs=P("x"))(spread)
    assert seen == [None], seen
    print("placement ok")
""")


@pytest.mark.not_on_colab  # a v7x's two devices (tests/conftest.py)
def test_split_heads_equals_one_device_on_two_simulated_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", SPLIT_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.split() == ["b3", "ok", "dense", "ok", "routed", "ok", "placement", "ok"], result.stdout


# -- v7x, compiled: each device's kernel runs half the heads ---------------------------------------

@pytest.fixture(scope="module")
def v7x_compiler(tpu_compiler):
    """The TPU compiler, where its libtpu builds for a v7x. Colab's libtpu 0.0.21.1 predates the v7x
    ("Invalid TPU external name: TPU7x"): skipped there only; the pinned libtpu must compile it."""
    from svg_lib.environment import libtpu_version

    try:
        tpu_compiler.compile_only_topology("v7x")
    except Exception as err:
        version = libtpu_version() or "0"
        older = tuple(int(p) for p in version.split(".")[:3] if p.isdigit()) < (0, 0, 42)
        if older and "TPU7x" in str(err):
            pytest.skip(f"libtpu {version} cannot build for a v7x ({str(err).splitlines()[0]}); libtpu 0.0.42 can")
        raise
    return tpu_compiler


def test_v7x_topology_gives_one_chip_two_devices(v7x_compiler):
    tpu_compiler = v7x_compiler
    devices = tpu_compiler.compile_only_topology("v7x").devices
    assert len(devices) == 2 and chip_devices(devices[0]) == tuple(devices)
    slice4 = tpu_compiler.compile_only_topology("v7x", "tpu7x:2x2x1").devices  # four chips, eight cores
    pair = chip_devices(slice4[2])
    assert len(pair) == 2 and len({tuple(d.coords) for d in pair}) == 1
    assert [d.core_on_chip for d in pair] == [0, 1]
    for target in ("v5p", "v6e"):  # megacore and single-core chips: one device each
        device = tpu_compiler.compile_only_device(target)
        assert chip_devices(device) == (device,)


@pytest.fixture(scope="module")
def v7x_small(v7x_compiler):
    from svg_lib.instruments.tpu.sharded import compile_split_attention

    config = get_preset("small")
    return config, compile_split_attention(config, split=True), compile_split_attention(config, split=False)


def test_v7x_split_runs_half_the_heads_on_each_device(v7x_small):
    config, split, one = v7x_small
    assert split.devices == 2 and one.devices == 1
    assert config.tokens % config.block_q  # a partial last tile: the kernel still sees the tokens as they are
    assert split.kernel_shapes == (f"bf16[{config.heads // 2},{config.tokens},{config.head_dim}]",)
    assert one.kernel_shapes == (f"bf16[{config.heads},{config.tokens},{config.head_dim}]",)
    # each device holds half of q, k, v and of the output
    assert 2 * split.memory["argument"] == one.memory["argument"] == 3 * np.prod(config.shape) * 2
    assert 2 * split.memory["output"] == one.memory["output"]
    assert "tpu7x:1x1x1" in split.describe() and "(1 heads each)" in split.describe()


def test_v7x_split_gradient_compiles(v7x_compiler):
    tpu_compiler = v7x_compiler
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from svg_lib.attention import build_attention
    from svg_lib.instruments.tpu.sharded import kernel_result_shapes

    config = get_preset("tiny")
    devices = tpu_compiler.compile_only_topology("v7x").devices
    f = build_attention(config.mask(), method="b3", heads=config.heads, tokens=config.tokens,
                        head_dim=config.head_dim, dtype=config.dtype, block_q=config.block_q,
                        block_kv=config.block_kv, interpret=False, generation="v7x", devices=devices)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    x = jax.ShapeDtypeStruct(config.shape, jnp.dtype(config.dtype),
                             sharding=NamedSharding(Mesh(np.array(devices), ("cores",)), P("cores")))
    compiled = tpu_compiler.compile_placed(grad, (x, x, x))
    shapes = kernel_result_shapes(compiled)
    assert len(shapes) >= 2 and all(f"[{config.heads // 2}," in s for s in shapes), shapes


def test_split_compile_refuses_a_chip_with_one_device(tpu_compiler):
    from svg_lib.instruments.tpu.sharded import compile_split_attention

    with pytest.raises(ValueError, match="one device per chip"):
        compile_split_attention(get_preset("tiny"), target="v6e")


# -- megacore: an equal share of each kind on each core -------------------------------------------

@pytest.mark.parametrize("heads", [2, 4, 6, 8, 10])
def test_pair_swaps_balance_every_routing(heads):
    rng = np.random.default_rng(heads)
    x = rng.standard_normal((heads, 3))
    for flags in itertools.product([False, True], repeat=heads):
        flags = np.array(flags)
        order = balanced_order(flags)
        assert sorted(order) == list(range(heads))
        halves = [flags[order[share.start:share.stop]] for share in parallel_split(heads)]
        assert abs(int(halves[0].sum()) - int(halves[1].sum())) <= 1   # temporal heads per core
        swaps = pair_swaps(flags)
        np.testing.assert_array_equal(balance_heads(x, swaps), x[order])
        np.testing.assert_array_equal(np.asarray(balanced_order(jnp.asarray(flags))), order)  # traced flags too


def test_pair_swaps_refuse_odd_heads():
    with pytest.raises(ValueError, match="5 heads is odd"):
        pair_swaps(np.zeros(5, bool))


def test_megacore_balance_refuses_bad_input():
    mask = get_preset("tiny").mask()
    with pytest.raises(ValueError, match="unknown in-kernel layer method 'dense'; valid: b1, b2, b3"):
        megacore_balance(mask, np.zeros(4, bool), method="dense", block_q=128, block_kv=128)
    with pytest.raises(TypeError, match="1-D bool array"):
        megacore_balance(mask, np.zeros(4, int), block_q=128, block_kv=128)


def test_blog_tiles_balance_before_and_after():
    mask = get_preset("blog").mask()
    clustered = np.array([True] * 5 + [False] * 5)
    r = megacore_balance(mask, clustered, method="b2", block_q=3328, block_kv=1536)
    assert r["per_head"]["spatial"]["visited"] == 509 and r["per_head"]["temporal"]["visited"] == 1150
    assert r["before"]["temporal"] == [5, 0] and r["before"]["visited"] == [5750, 2545]
    assert r["before"]["balance"] == pytest.approx(0.7213, abs=1e-4)   # the "about 72 %"
    assert r["after"]["temporal"] == [3, 2] and r["after"]["visited"] == [4468, 3827]
    assert r["after"]["balance"] == pytest.approx(0.9283, abs=1e-4)    # 5 temporal heads: 3 + 2 is the best
    even = megacore_balance(mask, np.array([True] * 4 + [False] * 6), method="b2", block_q=3328, block_kv=1536)
    assert even["after"]["temporal"] == [2, 2] and even["after"]["balance"] == 1.0
    assert even["before"]["balance"] < 0.8
    # b3 rounds both kinds to the same number of tiles here: balanced in either order
    b3 = megacore_balance(mask, clustered, method="b3", block_q=3328, block_kv=1536)
    assert b3["before"]["balance"] == b3["after"]["balance"] == 1.0


def test_balanced_in_kernel_layer_is_exact_data_driven_and_moves_nothing():
    g = VideoGeometry(4, 8, 8)
    mask = SVGMask.spatial(g, 0.35)
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((4, g.tokens, 32)), jnp.float32) for _ in range(3))
    kw = dict(method="b2", heads=4, tokens=g.tokens, head_dim=32, dtype=jnp.float32, block_q=128, block_kv=128,
              interpret=True)
    balanced = build_svg_attention_in_kernel(mask, balance_cores=True, **kw)
    plain = build_svg_attention_in_kernel(mask, balance_cores=False, **kw)
    routings = [np.array(f) for f in ([True, True, False, False], [False, True, True, False], [True] * 4)]
    flags = jnp.asarray(routings[0])
    # lowered for a TPU: the kernel gets the order as a third table and q, k, v as they are; besides
    # the scaling of q, nothing touches a [heads, tokens, head_dim] array outside it
    from jax import export
    tpu = build_svg_attention_in_kernel(mask, balance_cores=True, **{**kw, "interpret": False})
    spec = jax.ShapeDtypeStruct(q.shape, q.dtype)
    text = export.export(tpu, platforms=["tpu"])(spec, spec, spec, jax.ShapeDtypeStruct((4,), bool)).mlir_module()
    call = text[text.index("stablehlo.custom_call @tpu_custom_call"):]
    operands = call[:call.index("\n")].split(" : (")[1].split(")")[0].split(", ")
    assert operands[0] == operands[2] == "tensor<4xi32>" and operands[1].endswith("xi32>")
    assert operands[3:6] == [f"tensor<4x{g.tokens}x32xf32>"] * 3
    moves = [line for line in text.splitlines() if f"x{g.tokens}x" in line
             and any(op in line for op in ("gather", "stablehlo.transpose", "stablehlo.pad", "stablehlo.select"))]
    assert moves == []   # (the order itself is a [2, 2] transpose of head indices)
    balanced(q, k, v, flags), plain(q, k, v, flags)
    with CompileCounter() as counter:
        for routing in routings:
            f = jnp.asarray(routing)
            np.testing.assert_array_equal(np.asarray(balanced(q, k, v, f)), np.asarray(plain(q, k, v, f)))
    assert counter.count == 0   # a new routing is new data, not a new program


def test_balance_cores_refuses_bad_settings():
    g = VideoGeometry(3, 8, 16)
    kw = dict(method="b2", tokens=g.tokens, head_dim=128, dtype=jnp.float32, block_q=128, block_kv=128,
              interpret=True)
    with pytest.raises(ValueError, match="3 heads is odd"):
        build_svg_attention_in_kernel(SVGMask.spatial(g, 0.35), heads=3, balance_cores=True, **kw)
    with pytest.raises(TypeError, match="balance_cores must be None, True or False"):
        build_svg_attention_in_kernel(SVGMask.spatial(g, 0.35), heads=2, balance_cores="yes", **kw)


def test_balanced_layer_compiles_for_a_megacore_v5p(tpu_compiler):
    config = get_preset("tiny")
    f = build_svg_attention_in_kernel(config.mask(), method="b2", heads=4, tokens=config.tokens,
                                      head_dim=config.head_dim, dtype=config.dtype, block_q=config.block_q,
                                      block_kv=config.block_kv, interpret=False, balance_cores=True)
    args = tpu_compiler.shape_structs([((4, config.tokens, config.head_dim), config.dtype)] * 3 + [((4,), "bool")],
                                      "v5p")
    compiled = tpu_compiler.compile_placed(f, args)
    assert " gather(" not in compiled.as_text()
