"""Heads sharded over a mesh (svg_lib.multichip) against the single-device layer.

jax is already initialised with one CPU device in the pytest process, and the simulated device
count must be set before jax starts, so the mesh tests run in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from svg_lib import SVGMask, VideoGeometry, make_mesh

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from svg_lib import (SVGMask, TemporalMask, VideoGeometry, make_mesh, reference_attention,
                         sharded_svg_attention, svg_attention)
    from svg_lib.multichip import build_sharded_svg_attention, collective_counts

    assert len(jax.devices()) == 4, jax.devices()
    mesh = make_mesh(4)
    flags = jnp.asarray(np.array([False, True, True, False]))
    rng = np.random.default_rng(0)
    # 512 tokens split evenly over 4 devices; 315 tokens do not (padded for the exchange)
    for g in (VideoGeometry(8, 8, 8), VideoGeometry(5, 7, 9)):
        mask = SVGMask.spatial(g, 0.35)
        q, k, v = (jnp.asarray(rng.standard_normal((4, g.tokens, 32)), jnp.float32) for _ in range(3))
        single = svg_attention(q, k, v, flags, mask, block_q=128, block_kv=128)
        ref = jnp.where(flags[:, None, None], reference_attention(q, k, v, TemporalMask(mask)),
                        reference_attention(q, k, v, mask))
        np.testing.assert_allclose(single, ref, rtol=1e-5, atol=1e-5)
        seq = NamedSharding(mesh, P(None, "x", None))
        qs, ks, vs = (jax.device_put(x, seq) for x in (q, k, v)) if g.tokens % 4 == 0 else (q, k, v)
        for permute in ("after", "before"):
            out = sharded_svg_attention(qs, ks, vs, flags, mask, mesh=mesh, permute=permute,
                                        block_q=128, block_kv=128)
            # same kernel, same tiles, same order of sums on every head: bit-identical
            np.testing.assert_array_equal(np.asarray(out), np.asarray(single))
            if g.tokens % 4 == 0:  # handed back sequence-parallel (uneven token counts: XLA's choice)
                assert out.sharding.is_equivalent_to(seq, 3), out.sharding
            print(g.tokens, permute, "ok")
        # the routing is data here too: a new routing reuses the compiled program
        f = build_sharded_svg_attention(mask, mesh=mesh, heads=4, tokens=g.tokens, head_dim=32,
                                        dtype=jnp.float32, block_q=128, block_kv=128)
        f(qs, ks, vs, flags)
        compiled = f._cache_size()
        for fl in ([True] * 4, [False] * 4):
            f(qs, ks, vs, jnp.asarray(np.array(fl)))
        assert f._cache_size() == compiled
        if g.tokens % 4 == 0:
            counts = {p: collective_counts(build_sharded_svg_attention(
                mask, mesh=mesh, permute=p, heads=4, tokens=g.tokens, head_dim=32, dtype=jnp.float32,
                block_q=128, block_kv=128), qs, ks, vs, flags) for p in ("after", "before")}
            print(counts)
            # both: q, k, v to head-parallel and the output back. Permuting head-local data adds no
            # communication; permuting sequence-sharded data makes XLA gather across devices.
            assert counts["after"]["all-to-all"] == counts["before"]["all-to-all"] == 4, counts
            assert counts["after"]["all-gather"] == 0 and counts["before"]["all-gather"] > 0, counts
    try:
        sharded_svg_attention(q[:3], k[:3], v[:3], flags[:3], mask, mesh=mesh)
    except ValueError as e:
        assert "3 heads" in str(e), e
    else:
        raise AssertionError("3 heads over 4 devices should be refused")
    print("ALL OK")
""")


def test_sharded_layer_equals_single_device_on_simulated_mesh():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ALL OK" in proc.stdout


def test_mesh_larger_than_the_machine_is_refused():
    import jax

    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        make_mesh(len(jax.devices()) + 1)


def test_unknown_axis_and_placement_are_refused():
    from svg_lib import build_sharded_svg_attention

    g = VideoGeometry(2, 8, 8)
    mask, mesh = SVGMask.spatial(g, 0.5), make_mesh(1)
    common = dict(heads=2, tokens=g.tokens, head_dim=32, dtype="float32", block_q=128, block_kv=128)
    with pytest.raises(ValueError, match="axis_name"):
        build_sharded_svg_attention(mask, mesh=mesh, axis_name="y", **common)
    with pytest.raises(ValueError, match="permute"):
        build_sharded_svg_attention(mask, mesh=mesh, permute="inside", **common)
