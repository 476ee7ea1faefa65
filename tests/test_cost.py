"""Tests of svg_lib.instruments.tpu.cost: the TPU compiler's simulated cost of each tile body, and the plan's model.

Compiler tests take the `tpu_compiler` fixture and compile small probe kernels (256 x 256
tiles) in a subprocess. They pin what the instrument must get right, never a cycle count:
an untaken branch costs nothing, masking costs at least as much as not masking, an idle step
is far cheaper than a computed one, and results come back from the cache unchanged.
"""
import pytest

from svg_lib import SVGMask, VideoGeometry, plan_tiles
from svg_lib.attention import b3_mask
from svg_lib.instruments.tpu.cost import TileCost, cost_model, filled_from, load_reference, model_cycles, step_kinds, tile_cost
from svg_lib.instruments.tpu.probes import BODY_KINDS, Probe, run_probes
from svg_lib.core.planner import EMPTY
from svg_lib.methods import MethodPlans

BQ = BKV = 256


@pytest.fixture(scope="module")
def cost_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("svg_cache")


@pytest.fixture(scope="module")
def measured(tpu_compiler, cost_cache):
    import os
    old = os.environ.get("SVG_LIB_CACHE_DIR")
    os.environ["SVG_LIB_CACHE_DIR"] = str(cost_cache)
    try:
        first = tile_cost("v6e", block_q=BQ, block_kv=BKV)
        again = tile_cost("v6e", block_q=BQ, block_kv=BKV)
    finally:
        if old is None:
            os.environ.pop("SVG_LIB_CACHE_DIR")
        else:
            os.environ["SVG_LIB_CACHE_DIR"] = old
    return first, again


def test_untaken_branches_cost_nothing(tpu_compiler):
    """A body compiled in but never taken adds no simulated cycles (it does add code)."""
    probe = dict(kernel="svg_lib", block_q=BQ, block_kv=BKV, block_kv_compute=BKV, head_dim=128, rows=1, steps=2)
    probes = [Probe(kind="free", **probe),
              Probe(kind="free", bodies=("svg_masked", "padding_masked"), **probe),
              Probe(kind="idle", **probe),
              Probe(kind="idle", bodies=("free", "svg_masked"), **probe)]
    free, free_plus, idle, idle_plus = run_probes(probes, "v6e")
    assert abs(free_plus["cycles"] - free["cycles"]) <= 0.02 * free["cycles"]
    assert abs(idle_plus["cycles"] - idle["cycles"]) <= 0.02 * idle["cycles"] + 50
    assert free_plus["bundles"] > free["bundles"]  # the untaken bodies are there
    assert idle_plus["bundles"] > idle["bundles"]


def test_tile_body_kinds_order(measured):
    cost, _ = measured
    ours = cost.per_step["svg_lib"]
    assert set(ours) == set(BODY_KINDS)
    assert ours["svg_masked"] > ours["free"]          # the elementwise predicate is extra VPU work
    assert ours["padding_masked"] >= 0.99 * ours["free"]
    assert ours["idle"] < 0.2 * ours["free"]           # a skipped step: no body, no DMA
    # the roofline: the two matmuls alone cost less than any real body, and every body is put against them
    assert 0 < ours["matmuls"] < ours["free"] and cost.floor == ours["matmuls"]
    assert cost.vs_floor("svg_lib", "free") > 1 and cost.vs_floor("splash", "free") > 1
    assert "vs matmuls" in cost.table()
    theirs = cost.per_step["splash"]
    # Splash's mask-function path with the SVG kernel predicate (a column and a row per tile) costs
    # about what its mask-free path does at these small tiles (v6e 256 x 256: 839 against 859)
    assert theirs["svg_masked"] > 0.9 * theirs["free"] > 0
    assert cost.per_row["svg_lib"] > 0 and cost.per_row["splash"] > 0
    # Splash's block-mask body (B0 with padded keys) loads, ORs and selects its mask block on every
    # step, so costs more than its mask-free body (v6e 512 x 256: 1,342 against 990)
    assert theirs["blocks"] > theirs["free"]
    body = cost.body_bundles["svg_lib"]
    assert body["idle"] == 0 and body["svg_masked"] > body["free"] > 0


def test_cache_round_trip(measured, cost_cache):
    first, again = measured
    assert not first.from_cache and again.from_cache
    assert again.to_json() == first.to_json()
    assert again.cache_path.startswith(str(cost_cache))
    assert "libtpu" in again.versions and again.versions["jax"]


# -- the model (no compiler needed) -----------------------------------------------------------

def fake_cost():
    per_step = {"svg_lib": {"free": 10.0, "svg_masked": 20.0, "padding_masked": 11.0, "idle": 1.0},
                "splash": {"free": 9.0, "svg_masked": 15.0}}
    return TileCost("v6e", 128, 128, 128, 128, per_step, {"svg_lib": 100.0, "splash": 90.0}, {}, {}, {})


MASK = SVGMask.spatial(VideoGeometry(8, 8, 12), 0.3)


def test_step_kinds_cover_every_grid_step():
    plans = MethodPlans.of(MASK, 128, 128)
    plan, b3_plan = plans.mask, plans.tile_aligned
    assert b3_plan.mask == b3_mask(MASK, 128, 128)
    nq, nk = plan.classes.shape
    for method, p in (("b1", plan), ("b2", plan), ("b3", b3_plan)):
        kinds = step_kinds(method, plans)
        assert kinds.pop("rows") == nq
        assert sum(kinds.values()) == p.step_class.size
        assert kinds["idle"] == int((p.step_class == EMPTY).sum())
    assert "svg_masked" not in step_kinds("b3", plans)
    assert sum(v for k, v in step_kinds("splash_dense", plan).items() if k != "rows") == nq * nk


def test_model_sums_step_costs():
    plan = plan_tiles(MASK, 128, 128)
    kinds = step_kinds("b2", plan)
    want = 100.0 * kinds["rows"] + 10.0 * kinds["free"] + 20.0 * kinds["svg_masked"] + kinds["idle"]
    assert model_cycles("b2", fake_cost(), plan, heads=3) == pytest.approx(3 * want)
    out = cost_model(MASK, fake_cost(), block_q=128, block_kv=128)
    assert out["splash_dense/b0"] == 1.0
    assert out["b1"] > out["b2"]  # B1 masks what B2 runs free


def test_model_needs_the_plan():
    with pytest.raises(ValueError, match="needs its plan"):
        step_kinds("b2")
    with pytest.raises(ValueError, match=r"^unknown method 'b9'; valid: splash_dense, dense, b1, b2, b3$"):
        step_kinds("b9", plan_tiles(MASK, 128, 128))
    with pytest.raises(ValueError, match=r"^unknown method 'B3' \(did you mean 'b3'\?\)"):
        step_kinds("B3")  # checked before it asks for the plan


def test_each_method_takes_its_own_plan():
    plans = MethodPlans.of(MASK, 128, 128)
    assert plans.for_method("b2") is plans.mask and plans.for_method("b3") is plans.tile_aligned
    assert plans.for_method("dense") is plans.mask
    with pytest.raises(ValueError, match=r"b3 walks the tile-aligned mask's plan .* MethodPlans.of\(mask, block_q, block_kv\)"):
        step_kinds("b3", plans.mask)   # one TilePlan: the mask's own, no B3
    with pytest.raises(ValueError, match="b2 walks the mask's own plan"):
        model_cycles("b2", fake_cost(), MethodPlans(tile_aligned=plans.tile_aligned))
    with pytest.raises(ValueError, match="share one tile size"):
        MethodPlans(plans.mask, plan_tiles(b3_mask(MASK, 256, 128), 256, 128))
    with pytest.raises(ValueError, match="needs a plan"):
        MethodPlans()


def test_tile_cost_refuses_bad_input():
    with pytest.raises(ValueError, match="unknown TPU target"):
        tile_cost("v9", block_q=128, block_kv=128)
    with pytest.raises(ValueError, match="multiple of 128"):
        tile_cost("v6e", block_q=100, block_kv=128)
    with pytest.raises(ValueError, match="unknown kernel"):
        tile_cost("v6e", block_q=128, block_kv=128, kernels=("flash",))


def test_filled_from_takes_only_what_is_missing():
    base = fake_cost()
    partial = TileCost("v6e", 128, 128, 128, 128, {"svg_lib": {"free": 30.0, "svg_masked": 50.0}}, {}, {}, {}, {})
    full = filled_from(partial, base, padding_as_free=True)
    assert full.per_step["svg_lib"] == {"free": 30.0, "svg_masked": 50.0, "padding_masked": 30.0, "idle": 1.0}
    assert full.per_step["splash"] == base.per_step["splash"] and full.per_row == base.per_row
    assert "padding_masked" not in partial.per_step["svg_lib"]  # the input is left alone
    other = TileCost("v6e", 256, 128, 128, 128, {}, {}, {}, {}, {})
    with pytest.raises(ValueError, match="block sizes differ"):
        filled_from(other, base)


def test_committed_reference_reads_back():
    """The reference the notebooks read: every entry parses, and at the blog's tiles on a v6e
    svg_lib's mask-free body is no slower than Splash's (the claim the series makes from it)."""
    ref = load_reference()
    assert ref["versions"]["libtpu"] and ref["date"]
    after = ref["groups"]["after"]
    blog = after[("v6e", 3328, 1536)]
    assert blog.cycles_per_step("svg_lib", "free") <= blog.cycles_per_step("splash", "free")
    assert blog.cycles_per_step("svg_lib", "svg_masked") > blog.cycles_per_step("svg_lib", "free")


def test_committed_references_were_probed_from_this_tree():
    """Every committed figure of today's bodies carries the digest of the programs its probes compiled
    (their jaxprs, `probes.probed_digest`, the forward's and the backward's apart); a change to what a
    kernel, the mask's predicate or a probe computes makes that direction's figures stale, and this fails
    until they are re-probed (tools/forward-reference.py, tools/backward-reference.py)."""
    import json

    from svg_lib.instruments.tpu.cost import BACKWARD_REFERENCE_FILE, REFERENCE_FILE
    from svg_lib.instruments.tpu.probes import versions

    forward = json.loads(REFERENCE_FILE.read_text())
    backward = json.loads(BACKWARD_REFERENCE_FILE.read_text())
    stale = []
    for direction, name, record, entries in (("forward", "cost_reference.json", forward, forward["groups"]["after"]),
                                             ("backward", "backward_cost_reference.json", backward, backward["costs"])):
        source, tool = versions(direction)["source"], f"tools/{direction}-reference.py"
        stale += [f"{name} {e['target']} {e['block_q']} x {e['block_kv']}: probed from source {e['versions']['source']}, "
                  f"this tree's is {source} (re-probe: python {tool})" for e in entries if e["versions"]["source"] != source]
        assert record["versions"]["source"] == source, (name, source)
    assert not stale, "stale entries:\n" + "\n".join(stale)
    assert versions("forward")["source"] != versions("backward")["source"] != versions()["source"]


def test_probed_digest_follows_what_the_probes_compute(monkeypatch):
    """The digest sees a change to the tile body's arithmetic, and not a renamed copy of the same body;
    the backward's digest, whose probes run no forward tile body, sees neither."""
    from svg_lib.kernels import forward
    from svg_lib.instruments.tpu import probes

    base, base_forward, base_backward = (probes.probed_digest(d) for d in (None, "forward", "backward"))
    original = forward.online_softmax_tile

    def same_body(*args, **kwargs):
        return original(*args, **kwargs)

    def other_body(q_ref, *args, **kwargs):
        q_ref[...] = q_ref[...] * 2
        return original(q_ref, *args, **kwargs)

    for body, same in ((same_body, True), (other_body, False)):
        probes.probed_digest.cache_clear()
        monkeypatch.setattr(forward, "online_softmax_tile", body)
        assert (probes.probed_digest() == base) is same
        assert (probes.probed_digest("forward") == base_forward) is same
        assert probes.probed_digest("backward") == base_backward
    probes.probed_digest.cache_clear()


def test_b0_with_padded_keys_runs_splash_block_mask_body():
    """B0 is Splash with a full mask only when no key is padded; otherwise its mask comes as blocks
    and every step runs the block-mask body. A cost without that body says so, or is filled with
    the mask-free one on request (a lower bound)."""
    padded = SVGMask.spatial(VideoGeometry(4, 6, 10), 0.3)   # 240 tokens: 128-token key tiles pad 16
    exact = MASK                                               # 768 tokens: no padding
    assert step_kinds("splash_dense", plan_tiles(exact, 128, 128)).keys() == {"rows", "free"}
    assert step_kinds("splash_dense", plan_tiles(padded, 128, 128)).keys() == {"rows", "blocks"}
    cost = fake_cost()
    with pytest.raises(ValueError, match="blocks_as_free"):
        model_cycles("splash_dense", cost, plan_tiles(padded, 128, 128))
    lower = model_cycles("splash_dense", filled_from(cost, blocks_as_free=True), plan_tiles(padded, 128, 128))
    cost.per_step["splash"]["blocks"] = 12.0
    assert model_cycles("splash_dense", cost, plan_tiles(padded, 128, 128)) > lower


def test_cli_refuses_a_bad_block_size(capsys):
    from svg_lib.cli import main

    assert main(["cost", "--preset", "small", "--block-q", "100"]) == 2
    assert "multiple of 128" in capsys.readouterr().err


def test_backward_probes_compare_like_with_like(tpu_compiler, cost_cache, monkeypatch):
    """The backward's probes: every kernel costs cycles per step. Our split backward does the same
    work per tile as Splash's two backward kernels (a dq step and a dk/dv step), so its cost per tile
    lands near theirs; the fused kernels, ours and Splash's, one step per tile that computes s and p
    once, cost less than either; ours no more than Splash's, and within 1.15x of the tile's five
    matmuls alone (issue 23's goals), here and in the committed reference at the blog's tiles."""
    from svg_lib.instruments.tpu.cost import BACKWARD_KERNELS, backward_tile_cost, load_backward_reference
    monkeypatch.setenv("SVG_LIB_CACHE_DIR", str(cost_cache))
    cost = backward_tile_cost("v6e", block_q=512, block_kv=256)
    assert set(cost.per_step) == set(BACKWARD_KERNELS) and all(c["free"] > 0 for c in cost.per_step.values())
    assert 0.8 < cost.ratio() < 1.25
    assert max(cost.per_tile("svg_lib_fused"), cost.per_tile("splash_fused")) < min(cost.per_tile("svg_lib"),
                                                                                     cost.per_tile("splash"))
    reference = load_backward_reference()
    for where in (("v6e", 512, 256), ("v6e", 3328, 1536)):
        c = cost if where[1] == 512 else reference["costs"][where]
        assert c.per_tile("svg_lib_fused") <= c.per_tile("splash_fused"), where
        assert 1.0 <= c.vs_floor("svg_lib_fused") <= 1.15, where
    recorded = reference["costs"][("v6e", 512, 256)]
    for kernel in ("svg_lib_dq", "svg_lib_fused"):
        assert recorded.per_step[kernel]["free"] == pytest.approx(cost.per_step[kernel]["free"], rel=0.05)


def test_training_model_sums_forward_and_fused_backward_steps():
    """A training step's model at the blog's plan, from the committed references: each method's
    backward is its transposed schedule's steps priced per kind (B0: Splash's fused backward on every
    tile), the total is forward + backward, and the ratios are against splash_dense."""
    from svg_lib import PRESETS
    from svg_lib.instruments.tpu.cost import backward_step_kinds, load_backward_reference, training_model
    blog = PRESETS["blog"]
    where = ("v6e", blog.block_q, blog.block_kv)
    forward = load_reference()["groups"]["after"][where]
    backward = load_backward_reference()["costs"][where]
    model = training_model(blog, forward, backward, heads=1)
    b3_plan = plan_tiles(b3_mask(blog.mask(), blog.block_q, blog.block_kv), blog.block_q, blog.block_kv)
    kinds = backward_step_kinds("b3", MethodPlans(tile_aligned=b3_plan))
    q_index = b3_plan.transposed_tables[0]
    assert sum(kinds.values()) == q_index.size  # every grid step of the transposed walk, idle ones included
    fused = backward.per_step["svg_lib_fused"]
    want = (kinds["free"] * fused["free"] + kinds["svg_masked"] * fused["svg_masked"]
            + kinds["idle"] * forward.per_step["svg_lib"]["idle"])
    assert model["b3"]["backward"] == pytest.approx(want)
    nq, nk = b3_plan.grid
    assert model["splash_dense"]["backward"] == pytest.approx(nq * nk * backward.per_step["splash_fused"]["free"])
    for m in ("splash_dense", "b3"):
        assert model[m]["total"] == pytest.approx(model[m]["forward"] + model[m]["backward"])
    ratios = model["ratios"]["b3"]
    assert ratios["forward"] < ratios["total"] < 1 and ratios["total"] <= 0.40  # issue 23's goal, in the model
    with pytest.raises(ValueError, match="tiles"):
        training_model(blog, forward, load_backward_reference()["costs"][("v6e", 512, 256)])


def test_the_probe_compile_shows_its_progress_and_stops_at_its_timeout(tmp_path, monkeypatch):
    """The compiler process logs a line per probe; the bar follows them, and a process past its time is stopped."""
    import subprocess
    import sys

    from svg_lib.instruments.tpu import probes

    updates = []

    class Bar:
        def update(self, n):
            updates.append(n)

        def close(self):
            pass

    monkeypatch.setattr(probes, "progress_bar", lambda **kw: Bar())
    log = tmp_path / "child.log"
    script = ("import json, sys, time\n"
              "for n in range(3):\n"
              "    print('libtpu chatter', flush=True)\n"
              "    print(json.dumps({'done': n + 1, 'of': 3}), flush=True)\n"
              "    time.sleep(0.6)\n")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
        probes._follow(proc, str(log), 3, "v6e", timeout=60)
    assert sum(updates) == 3 and all(n > 0 for n in updates)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=out)
        with pytest.raises(RuntimeError, match="ran past 1 s"):
            probes._follow(proc, str(log), 3, "v6e", timeout=1)
    assert proc.returncode is not None
