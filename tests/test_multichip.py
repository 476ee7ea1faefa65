"""Heads sharded over a mesh (svg_lib.layers.multichip) against the single-device layer.

jax is already initialised with one CPU device in the pytest process, and the simulated device
count must be set before jax starts, so the mesh tests run in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from svg_lib import SVGMask, VideoGeometry, make_mesh

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from svg_lib import (SVGMask, TemporalMask, VideoGeometry, make_mesh, reference_attention,
                         sharded_svg_attention, svg_attention, temporal_major_permutation)
    from svg_lib.layers.multichip import (build_sharded_svg_attention, collective_counts, hlo_collectives,
                                   shard_exchange_tables)

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
        layers = {p: build_sharded_svg_attention(mask, mesh=mesh, permute=p, heads=4, tokens=g.tokens, head_dim=32,
                                                 dtype=jnp.float32, block_q=128, block_kv=128)
                  for p in ("after", "before")}
        report = {p: hlo_collectives(f.lower(qs, ks, vs, flags).compile()) for p, f in layers.items()}
        print({p: {c.kind: c.count for c in r.values()} for p, r in report.items()})
        assert {c.kind: c.count for c in report["after"].values()} == collective_counts(layers["after"], qs, ks, vs, flags)
        # permuting before the exchange costs four more all-to-alls (the permutation of q, k, v and its
        # inverse on the output) and nothing else; permuting after it costs no communication at all
        more = {kind: report["before"][kind].count - report["after"][kind].count for kind in report["after"]}
        assert more == {"all-to-all": 4, "all-gather": 0, "all-reduce": 0, "collective-permute": 0,
                        "reduce-scatter": 0}, report
        if g.tokens % 4:
            continue  # 315 tokens: the unpadded output cannot come back sequence-sharded (XLA gathers it)
        # "after": the layer's own exchange (q, k, v to head-parallel, the output back) and nothing else
        assert report["after"]["all-to-all"].count == 4, report
        assert all(c.count == 0 for kind, c in report["after"].items() if kind != "all-to-all"), report
        padded = -(-g.tokens // 4) * 4
        shard = 4 * (padded // 4) * 32 * 4   # one device's [heads, padded/P, D] float32 block
        assert report["after"]["all-to-all"].operand_bytes == 4 * shard, report["after"]
        assert report["after"]["all-to-all"].group_sizes == (4,), report["after"]
        # each extra all-to-all carries one device's [heads, P * block, D]: its shard, regrouped by destination
        perm = np.concatenate([temporal_major_permutation(g), np.arange(g.tokens, padded)])
        block = shard_exchange_tables(perm, 4).block
        assert block >= padded // 16
        extra = report["before"]["all-to-all"].operand_bytes - 4 * shard
        assert extra == 4 * (4 * 4 * block * 32 * 4), (extra, block)
    try:
        sharded_svg_attention(q[:3], k[:3], v[:3], flags[:3], mask, mesh=mesh)
    except ValueError as e:
        assert "3 heads" in str(e), e
    else:
        raise AssertionError("3 heads over 4 devices should be refused")
    print("ALL OK")
""")


@pytest.mark.not_on_colab  # several chips (tests/conftest.py); notebook 09 compiles its layer there
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


# --- permuting a sequence-sharded array with one all-to-all -----------------------------------

@pytest.mark.parametrize("geometry,devices", [(VideoGeometry(21, 45, 80), 8), (VideoGeometry(5, 7, 9), 4),
                                              (VideoGeometry(8, 8, 8), 4), (VideoGeometry(2, 3, 4), 3)])
def test_shard_exchange_tables_deliver_the_permuted_shards(geometry, devices):
    from svg_lib import temporal_major_permutation
    from svg_lib.layers.multichip import shard_exchange_tables

    tokens = geometry.tokens
    padded = -(-tokens // devices) * devices
    perm = np.concatenate([temporal_major_permutation(geometry), np.arange(tokens, padded)])
    t = shard_exchange_tables(perm, devices)
    n = padded // devices
    x = np.random.default_rng(0).permutation(padded)
    shards = x.reshape(devices, n)
    sent = np.stack([shards[d][t.send[d]] for d in range(devices)]).reshape(devices, devices, t.block)
    received = sent.transpose(1, 0, 2).reshape(devices, devices * t.block)   # what a tiled all-to-all does
    out = np.stack([received[e][t.recv[e]] for e in range(devices)]).ravel()
    np.testing.assert_array_equal(out, x[perm])
    assert t.shares.sum() == padded and t.block == t.shares.max()
    if geometry.frames % devices and geometry.frame_tokens % devices:
        assert t.shares.min() < t.shares.max()   # frames cut across shards: uneven shares, padded blocks


def test_shard_exchange_tables_refuse_bad_input():
    from svg_lib.layers.multichip import shard_exchange_tables

    with pytest.raises(ValueError, match="equal shards"):
        shard_exchange_tables(np.arange(10), 4)
    with pytest.raises(ValueError, match="permutation"):
        shard_exchange_tables(np.zeros(8, int), 4)
    with pytest.raises(ValueError, match="devices"):
        shard_exchange_tables(np.arange(8), 0)


def test_hlo_collectives_pairs_async_start_and_done():
    from svg_lib.layers.multichip import hlo_collectives

    text = textwrap.dedent("""
        %p = bf16[2,64,128]{2,1,0} parameter(0)
        %ag = (bf16[2,64,128]{2,1,0}, bf16[2,512,128]{2,1,0}) all-gather-start(%p), replica_groups=[1,8]<=[8], dimensions={1}
        %agd = bf16[2,512,128]{2,1,0} all-gather-done(%ag)
        ROOT %a2a = bf16[2,64,128]{2,1,0:T(8,128)(2,1)} all-to-all(%p), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
    """)
    c = hlo_collectives(text)
    assert c["all-gather"].count == 1 and c["all-to-all"].count == 1
    assert c["all-gather"].operand_bytes == 2 * 64 * 128 * 2 and c["all-gather"].result_bytes == 2 * 512 * 128 * 2
    assert c["all-gather"].group_sizes == (8,) and c["all-to-all"].group_sizes == (8,)
    assert c["all-to-all"].shapes == ("bf16[2,64,128]",) and c["all-reduce"].count == 0


# --- the layer compiled for an 8-chip v6e slice (libtpu, compile-only) ------------------------
# CI compiles a small geometry that keeps the blog's awkward part, 21 frames that do not divide by
# 8 chips (a shard boundary cuts through frames); the blog's per-layer size (40 heads, 75,600
# tokens, 3328 x 1536) takes minutes to compile on a 2-core machine and lives in notebook 09.

CI_GEOMETRY = VideoGeometry(21, 8, 16)   # 2,688 tokens, 336 per chip


@pytest.fixture(scope="module")
def compiled_layers(tpu_compiler):
    from svg_lib import compile_sharded_layer

    mask = SVGMask.spatial(CI_GEOMETRY, 0.35)
    return {p: compile_sharded_layer(mask, permute=p, heads=8, head_dim=128, dtype="bfloat16", method="b3",
                                     block_q=512, block_kv=512, topology="v6e:2x4") for p in ("after", "before")}


@pytest.mark.not_on_colab  # several chips (tests/conftest.py); notebook 09 compiles its layer there
def test_compiled_layer_permuting_after_the_exchange_adds_no_collective(compiled_layers):
    from svg_lib import temporal_major_permutation
    from svg_lib.layers.multichip import shard_exchange_tables

    after, before = compiled_layers["after"], compiled_layers["before"]
    assert after.chips == before.chips == 8 and "compile-only v6e:2x4" in after.evidence
    shard = 8 * (CI_GEOMETRY.tokens // 8) * 128 * 2     # one chip's [heads, tokens/8, D] bf16
    # "after": the layer's own four all-to-alls (q, k, v to head-parallel, the output back), nothing else
    assert {k: c.count for k, c in after.collectives.items()} == {
        "all-to-all": 4, "all-gather": 0, "all-reduce": 0, "collective-permute": 0, "reduce-scatter": 0}
    assert after.collectives["all-to-all"].operand_bytes == 4 * shard
    assert after.collectives["all-to-all"].group_sizes == (8,)
    # "before": the same four plus one all-to-all per permuted array (q, k, v, the output's inverse)
    assert {k: c.count for k, c in before.collectives.items()} == {
        "all-to-all": 8, "all-gather": 0, "all-reduce": 0, "collective-permute": 0, "reduce-scatter": 0}
    perm = temporal_major_permutation(CI_GEOMETRY)
    block = shard_exchange_tables(perm, 8).block
    assert block > CI_GEOMETRY.tokens // 64                 # frames cut across chips: padded blocks
    assert before.collectives["all-to-all"].operand_bytes == 4 * shard + 4 * 8 * (8 * block) * 128 * 2


@pytest.mark.not_on_colab  # several chips (tests/conftest.py); notebook 09 compiles its layer there
def test_compiled_layer_memory_per_chip(compiled_layers):
    shard = 8 * (CI_GEOMETRY.tokens // 8) * 128 * 2
    for report in compiled_layers.values():
        mem = report.memory
        # arguments: q, k, v shards and the 8 flags (padded to the chip's tiling); output: one shard
        assert 3 * shard <= mem["argument"] < 3 * shard + 64 * 1024, mem
        assert mem["output"] == shard, mem
        assert mem["generated_code"] > 0, mem


def test_compile_sharded_layer_refuses_heads_that_do_not_split(tpu_compiler):
    from svg_lib import compile_sharded_layer

    with pytest.raises(ValueError, match="10 heads cannot be split evenly over the 8 devices"):
        compile_sharded_layer(SVGMask.spatial(CI_GEOMETRY, 0.35), heads=10, block_q=512, block_kv=512)


def test_command_line_writes_the_compiled_report(tpu_compiler, tmp_path, capsys):
    import json

    from svg_lib.cli import main

    path = tmp_path / "sharded.json"
    assert main(["sharded", "--preset", "tiny", "--heads", "8", "--permute", "after", "--json", str(path)]) == 0
    assert "compile-only v6e:2x4" in capsys.readouterr().out
    (row,) = json.loads(path.read_text())
    assert row["permute"] == "after" and row["chips"] == 8 and row["tokens"] == 384
    assert row["collectives"]["all-to-all"]["count"] == 4 and row["collectives"]["all-gather"]["count"] == 0
    assert row["memory"]["output"] == 8 * (384 // 8) * 128 * 4   # the tiny preset is float32


# -- choosing the mesh's devices (notebook 09) -------------------------------------------------

class _FakeDevice:
    """Just what choose_mesh_devices reads of a jax device: its platform."""

    def __init__(self, platform, index):
        self.platform, self.id = platform, index

    def __repr__(self):
        return f"{self.platform}:{self.id}"


def _fake(platform, n):
    return [_FakeDevice(platform, i) for i in range(n)]


def test_choose_mesh_devices_prefers_the_default_backend():
    from svg_lib.layers.multichip import choose_mesh_devices

    slice_ = choose_mesh_devices(8, default_devices=_fake("tpu", 8), cpu_devices=_fake("cpu", 4))
    assert slice_.source == "default" and len(slice_.devices) == 8 and not slice_.interpret
    assert slice_.platform == "tpu" and "default backend" in slice_.describe()
    # a mesh of at most `most` devices, a power of two: 6 simulated devices give 4
    cpu = choose_mesh_devices(8, default_devices=_fake("cpu", 6), cpu_devices=_fake("cpu", 6))
    assert cpu.source == "default" and len(cpu.devices) == 4 and cpu.interpret


def test_one_tpu_chip_falls_back_to_the_cpu_devices_beside_it():
    from svg_lib.layers.multichip import choose_mesh_devices

    cpus = _fake("cpu", 4)
    choice = choose_mesh_devices(8, default_devices=_fake("tpu", 1), cpu_devices=cpus)
    assert choice.source == "cpu" and list(choice.devices) == cpus
    assert choice.interpret, "kernels on CPU devices must run in interpret mode, even on a TPU runtime"
    assert choice.runs and choice.platform == "cpu"
    assert "fell back to the CPU backend" in choice.describe() and "(tpu) has 1 device" in choice.describe()


def test_no_devices_to_spare_means_no_mesh():
    from svg_lib.layers.multichip import choose_mesh_devices

    for default, cpu in ((_fake("tpu", 1), _fake("cpu", 1)), (_fake("cpu", 1), _fake("cpu", 1)),
                         (_fake("tpu", 1), [])):
        choice = choose_mesh_devices(8, default_devices=default, cpu_devices=cpu)
        assert choice.source == "none" and not choice.runs and len(choice.devices) == 1
        assert "fell back to compiled evidence" in choice.describe()


def test_choose_mesh_devices_on_this_process_uses_jax():
    import jax

    from svg_lib.layers.multichip import choose_mesh_devices

    choice = choose_mesh_devices(8)
    assert choice.default_count == len(jax.devices())
    assert choice.runs == (len(jax.devices()) > 1 or len(jax.devices("cpu")) > 1)


def _notebook_script(path: Path) -> str:
    """Notebook 09's code cells as one script (it uses no IPython magics), but for section 6's
    compile of the case study's 8-chip layer (40 heads, 75,600 tokens: minutes of a core). That
    cell reads nothing of the devices chosen, so it does here what it does in the notebook, which
    nbval and the Colab replica run whole; here its result is None, and the cells reading it skip
    as they do without libtpu."""
    import json

    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not any(line.lstrip().startswith(("%", "!")) for cell in code for line in cell.splitlines())
    blog_compile = [i for i, cell in enumerate(code) if "compile_sharded_layer(blog.mask()" in cell]
    assert len(blog_compile) == 1, "notebook 09 should compile the case study's layer in one cell"
    cell = code[blog_compile[0]]
    assert "choice" not in cell and "devices" not in cell and "\ntpu_layer = None\n" in cell, cell
    kept = cell[:cell.index("\ntpu_layer = None\n")]  # its imports and the preset, not the compile
    code[blog_compile[0]] = kept + "\ntpu_layer = None   # compiled in the notebook itself (see _notebook_script)"
    return "\n\n".join(code)


def test_notebook_09_completes_on_a_single_device(tmp_path):
    # One device, as on Colab's v5e-1 without simulated CPU devices: XLA_FLAGS already names the device
    # count (1), so the first cell leaves it alone, and jax sees a single CPU device on every backend.
    script = tmp_path / "nb09.py"
    script.write_text(_notebook_script(REPO / "notebooks" / "09_scaling_out.ipynb"))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu",
           "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], cwd=REPO / "notebooks", env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "fell back to compiled evidence" in out and "1 cpu device" in out, out[:2000]
    assert "no mesh here" in out and "mesh axis 'x'" not in out
