"""Every Pallas kernel compiled for TPU at the blog's size, by the real TPU compiler, on this CPU.

`svg_lib.compile_for_tpu` hands a kernel to libtpu for a compile-only chip (nothing runs):
Mosaic compiles it, VMEM and SMEM are allocated and checked. These tests compile every
method at the case study's size (75,600 tokens, 10 heads of 128, bf16, 3328 x 1536 tiles) for
a v6e, B0 and B3 for a v5e too, and check that a configuration the compiler refuses comes back as
a report saying where and why, never as an exception.

Time: each blog-size compile takes 20 to 40 s of a CPU core, and Splash with the exact mask builds
its mask info on the host for about 40 s. The v5e compiles what differs there: B3, the headline
(Colab's free tier; make test-colab compiles it with Colab's libtpu too), and dense Splash, whose
VMEM the v5e's 16 MiB default refuses. Dense, B1 and B2 load B3's blocks through B3's tile body
(B1 adds its mask predicate): their v6e compiles test their own code, and what a v5e changes (a
128-wide MXU, the smaller default scoped VMEM) is tested where it bites.

Splash's kernels take no `vmem_limit_bytes` (`make_splash_mha` has no such argument), so
`build_attention` raises the chip's default scoped VMEM for them through a per-jit compiler
option; with it, Splash with a full mask (the blog's B0) compiles for a v5e at the blog's
tiles, where the v5e's 16 MiB default alone refuses it (about 25 MiB needed, libtpu 0.0.42.1).

Tests take the `tpu_compiler` fixture: they skip without libtpu, except under
`make test`, which sets SVG_LIB_REQUIRE_TPU_COMPILER=1.
"""
from __future__ import annotations

import json

import pytest

from svg_lib import TARGETS, BenchConfig, CompileReport, compile_for_tpu
from svg_lib.problem import PALLAS_METHODS
from svg_lib.cli import main
from svg_lib.instruments.tpu.compiler import check_targets, compile_all

BLOG = BenchConfig.from_preset("blog")
TWO_GENERATIONS = ("v6e", "v5e")
ALSO_ON_V5E = ("splash_dense", "b3")  # see the module docstring


def _targets(method):
    return TWO_GENERATIONS if method in ALSO_ON_V5E else ("v6e",)


@pytest.fixture(scope="module")
def blog_reports(tpu_compiler):
    """{(method, target): CompileReport} at the blog's size; each method built once."""
    reports = {}
    for method in PALLAS_METHODS:
        for r in compile_all(BLOG, (method,), _targets(method)):
            reports[(r.method, r.target)] = r
    return reports


def test_every_pallas_kernel_compiles_at_the_blog_size(blog_reports):
    expected = {(m, t) for m in PALLAS_METHODS for t in _targets(m)}
    assert set(blog_reports) == expected
    assert {t for (_, t) in blog_reports} == set(TWO_GENERATIONS)
    failed = [r.line() for r in blog_reports.values() if not r.ok]
    assert not failed, "\n".join(failed)


def test_splash_gets_its_vmem_through_the_default_scoped_limit(blog_reports):
    # the v5e's default scoped VMEM (16 MiB) alone refuses Splash at the blog's tiles; the limit
    # build_attention gives its pallas_calls (splash.with_vmem_limit, sized by the estimate) is
    # what makes it compile
    from svg_lib.memory.vmem import estimate_vmem

    r = blog_reports[("splash_dense", "v5e")]
    assert r.ok, r.line()
    assert r.vmem_limit_bytes is None  # Splash itself is given no limit ...
    e = estimate_vmem("splash_dense", BLOG.block_q, BLOG.block_kv, BLOG.head_dim, BLOG.dtype,
                      BLOG.block_kv_compute, "v5e", splash_mask="blocks")
    assert e.total > TARGETS["v5e"].default_scoped_vmem  # ... the default would not hold it ...
    assert e.vmem_limit_bytes is not None and e.vmem_limit_bytes >= e.total  # ... the raised one does


def test_compiled_memory_analysis_is_the_problems_own(blog_reports):
    # the compiled program's HBM arguments are q, k, v and its output one more array of that shape
    heads, tokens, head_dim = BLOG.shape
    array_bytes = heads * tokens * head_dim * 2  # bfloat16
    for (method, target), r in blog_reports.items():
        assert r.device_kind == TARGETS[target].device_kind
        assert r.argument_bytes == 3 * array_bytes, (method, target)
        assert r.output_bytes == array_bytes, (method, target)
        assert r.code_bytes > 0 and r.compile_s > 0 and r.build_s >= 0
        assert r.stage is None and r.error is None and r.refused_by is None
        assert r.vmem_fits and r.vmem_bytes <= r.vmem_budget < r.vmem_capacity == TARGETS[target].vmem_bytes
        assert (r.block_q, r.block_kv, r.block_kv_compute) == (3328, 1536, 512)
        assert r.libtpu and r.line().split()[:4] == [method, target, "3328x1536", "ok"]


def test_each_target_gets_its_own_vmem_plan(blog_reports):
    # built per target: the VMEM budget and the limit a kernel asks for are that chip's
    for (method, target), r in blog_reports.items():
        assert r.vmem_capacity == TARGETS[target].vmem_bytes and r.default_scoped_vmem == TARGETS[target].default_scoped_vmem


@pytest.mark.parametrize("target", ["v5e", "v6e", "v5p", "v7x"])
def test_b3_gradient_compiles_fused_at_the_blog_size(tpu_compiler, target):
    """jax.grad through B3 at the blog's size: its forward with the log-sum-exp and the fused backward
    (one head: every head runs the same kernels) compile on every chip the estimate lets it run on,
    the 64 MiB v5p and v7x included (their 56.1 MiB estimate under a 60.8 MiB budget; the compiler
    allocates 55.29 MiB there, libtpu 0.0.42.1), so jax.grad picks the fused form everywhere."""
    from svg_lib.memory.vmem import estimate_vmem
    from svg_lib.instruments.tpu.compiler import compile_gradient
    q_len = -(-BLOG.tokens // BLOG.block_q) * BLOG.block_q
    estimate = estimate_vmem("b3:fused", BLOG.block_q, BLOG.block_kv, BLOG.head_dim, BLOG.dtype,
                             BLOG.block_kv_compute, target, q_len=q_len)
    assert estimate.fits, estimate
    verdict = compile_gradient(BLOG, "b3", target, heads=1, backward="fused")
    assert verdict["ok"], verdict["summary"] or verdict["error"]
    assert verdict["temp_bytes"] > 0


def test_smem_overflow_is_refused_before_compiling(tpu_compiler):
    # 256 x 256 tiles at 1440p (21 x 90 x 160 = 302,400 tokens): even the packed schedule
    # (two steps per SMEM word) outgrows the 1 MiB of SMEM; build_attention refuses it with the
    # sizes and larger blocks that fit, and the report says so instead of raising
    config = BenchConfig.from_preset("blog", height=90, width=160, heads=1, block_q=256, block_kv=256)
    r = compile_for_tpu(config, "b2", "v6e")
    assert isinstance(r, CompileReport)
    assert r.vmem_fits
    assert (r.ok, r.stage, r.refused_by) == (False, "smem", "estimate")
    assert "overflows SMEM" in r.error and "fits" in r.error and r.compile_s is None
    assert r.argument_bytes is None and "FAILED" in r.line()


def test_vmem_estimate_refusal_skips_the_compiler(tpu_compiler):
    # a v4 TensorCore has 16 MiB of VMEM; the blog's tiles need about 40 MiB
    r = compile_for_tpu(BenchConfig.from_preset("blog", heads=1), "b2", "v4")
    assert (r.ok, r.stage, r.refused_by) == (False, "vmem", "estimate")
    assert r.compile_s is None and not r.vmem_fits and r.vmem_capacity == 16 * 2**20
    assert "fits" in r.error  # check_fits suggests a configuration that does


def test_bad_arguments_raise(tpu_compiler):
    with pytest.raises(TypeError, match="BenchConfig"):
        compile_for_tpu("blog", "b2")
    with pytest.raises(ValueError, match="Pallas kernel"):
        compile_for_tpu(BLOG, "reference")
    with pytest.raises(ValueError, match="unknown TPU target 'v9'.*v6e"):
        compile_for_tpu(BLOG, "b2", "v9")
    with pytest.raises(ValueError, match="'flash' for TPU: choose Pallas kernels"):
        compile_all(BLOG, ("b2", "flash"))


def test_targets(tpu_compiler):
    assert check_targets("all") == tuple(TARGETS.values())
    assert check_targets(["v6e", "v5e", "v6e"]) == (TARGETS["v6e"], TARGETS["v5e"])
    with pytest.raises(ValueError, match="no target"):
        check_targets([])


def test_target_table_agrees_with_jax(tpu_compiler):
    # the same facts as jax's own TPU table, where this jax has one
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    chips = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v7x": "7x"}
    assert set(chips) == set(TARGETS)
    for name, chip in chips.items():
        info = tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion(chip), 1)
        t = TARGETS[name]
        assert (t.vmem_bytes, t.smem_bytes, t.mxu, t.mxus_per_core) == (
            info.vmem_capacity_bytes, info.smem_capacity_bytes, info.mxu_column_size, info.num_mxus), name


def test_every_target_compiles_a_small_kernel(tpu_compiler):
    # the topology names of TARGETS (tpu7x for the v7x included) give compile-only devices
    config = BenchConfig.from_preset("tiny", heads=1)
    reports = compile_all(config, ("b2",), "all")
    assert [r.target for r in reports] == list(TARGETS)
    assert all(r.ok for r in reports), [r.line() for r in reports if not r.ok]
    assert [r.device_kind for r in reports] == [t.device_kind for t in TARGETS.values()]


# -- command line ----------------------------------------------------------------------------

def test_cli_compiles_and_writes_json(tpu_compiler, tmp_path, capsys):
    path = tmp_path / "compile.json"
    status = main(["compile", "--preset", "tiny", "--methods", "b3", "--target", "v6e", "--target", "v5e",
                   "--sweep-block-q", "128,256", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    data = json.loads(path.read_text())
    assert [(r["method"], r["block_q"], r["target"]) for r in data["reports"]] == [
        ("b3", 128, "v6e"), ("b3", 128, "v5e"), ("b3", 256, "v6e"), ("b3", 256, "v5e")]
    assert all(r["ok"] for r in data["reports"]) and data["libtpu"] == data["reports"][0]["libtpu"]
    assert data["config"]["tokens"] == BenchConfig.from_preset("tiny").tokens and data["sweep_block_q"] == [128, 256]
    assert "4 of 4 compiled" in out and "no speed measured" in out


def test_cli_exit_status_1_when_a_method_fails(tpu_compiler, tmp_path, capsys):
    # the blog's tiles on a v4 (16 MiB of VMEM): refused by the estimate, before any compile
    path = tmp_path / "refused.json"
    status = main(["compile", "--preset", "blog", "--methods", "b2,b3", "--target", "v4", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED: b2 3328x1536 on v4, b3 3328x1536 on v4" in out and "refused by our VMEM estimate" in out
    assert [r["refused_by"] for r in json.loads(path.read_text())["reports"]] == ["estimate", "estimate"]


def test_cli_bad_input(tpu_compiler, capsys):
    assert main(["compile", "--preset", "tiny", "--target", "v9"]) == 2
    assert "v9" in capsys.readouterr().err
    assert main(["compile", "--preset", "tiny", "--methods", "reference"]) == 2
    assert main(["compile", "--list-targets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in TARGETS) and "VMEM" in out and "MXU" in out


def test_cli_without_libtpu_names_the_extra(monkeypatch, capsys):
    import svg_lib.cli.compile as compile_command
    import svg_lib.environment as environment

    monkeypatch.setattr(environment, "has_libtpu", lambda: False)  # what compile_for_tpu asks
    monkeypatch.setattr(compile_command, "has_libtpu", lambda: False)  # what the command asks
    assert main(["compile", "--preset", "tiny"]) == 2
    assert "tpu-compile" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="tpu-compile"):
        compile_for_tpu(BenchConfig.from_preset("tiny"), "b2")
