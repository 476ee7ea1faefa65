"""Grid traversal: the trace derived from the schedule tables against what the TPU interpreter really visits."""
import numpy as np
import pytest

from svg_lib import b3_mask, get_preset, plan_tiles
from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.planner import EMPTY
from svg_lib.teaching.traversal import RECORD_LIMIT_STEPS, grid_trace, kernel_plan, plot_traversal, recorded_grid_trace


@pytest.fixture(scope="module")
def tiny_plan():
    p = get_preset("tiny")
    return plan_tiles(p.mask(), 128, 128)


@pytest.fixture(scope="module")
def hand_plan():
    # Row 1 starts on the tile row 0 ended on (tile 1): a working step that needs no DMA.
    kept = np.array([[0, 1, 0], [0, 1, 1], [1, 0, 0]], dtype=bool)
    return plan_tiles(TileAlignedMask(384, 128, 128, kept), 128, 128)


def expected_dma(kv_index_rows):
    """Independent rule: a step copies K/V in when its block index differs from the step before."""
    flat = np.concatenate([np.asarray(r) for r in kv_index_rows])
    return [True] + list(flat[1:] != flat[:-1])


@pytest.mark.parametrize("method", ["b1", "b3"])
def test_table_trace_equals_the_interpreter_recording(tiny_plan, method):
    recorded = recorded_grid_trace(tiny_plan, method)
    run = kernel_plan(tiny_plan, method)
    nq, steps = run.kv_index.shape
    # every grid point exactly once; within a query tile the slots run 0, 1, ... without interruption
    assert sorted((st.i, st.s) for st in recorded) == [(i, s) for i in range(nq) for s in range(steps)]
    for n in range(0, len(recorded), steps):
        row = recorded[n:n + steps]
        assert len({st.i for st in row}) == 1 and [st.s for st in row] == list(range(steps))
    derived = grid_trace(tiny_plan, method, row_order=recorded.row_order)
    assert derived.keys() == recorded.keys()
    assert [st.order for st in recorded] == list(range(nq * steps))


def test_trace_follows_the_tables(tiny_plan):
    for method in ("b1", "b2", "b3"):
        trace = grid_trace(tiny_plan, method)
        run = kernel_plan(tiny_plan, method)
        assert [st.kv_tile for st in trace] == list(run.kv_index.ravel())
        assert [st.dma for st in trace] == expected_dma(run.kv_index)
        idle = run.step_class.ravel() == EMPTY
        assert [st.kind == "idle" for st in trace] == list(idle)
        # an idle step copies only as its row's first step: the tile the row visits first
        assert not any(st.dma for st in trace if st.kind == "idle" and st.s > 0)
        c = trace.counts()
        assert c["steps"] == run.kv_index.size and c["dma"] + c["no_dma"] == c["steps"]
        assert c["idle"] == int(idle.sum())
        if method == "b1":
            assert c["full"] == 0 and c["partial"] == int(run.visited.sum())  # B1 masks every visited tile
        else:
            assert c["partial"] == int(run.needs_mask.sum()) and c["full"] == int((run.classes == 2).sum())
    # b3 really runs the tile-aligned plan: no boundary tile needs a mask on 3 x 128 tokens
    b3 = kernel_plan(tiny_plan, "b3")
    assert b3.mask is b3_mask(tiny_plan.mask, 128, 128) or np.array_equal(
        b3.classes, plan_tiles(b3_mask(tiny_plan.mask, 128, 128), 128, 128).classes)
    assert grid_trace(tiny_plan, "b3").counts()["partial"] == 0


def test_a_row_may_start_on_the_resident_block(hand_plan):
    trace = grid_trace(hand_plan, "b2")
    assert [(st.i, st.s, st.kv_tile, st.dma, st.kind) for st in trace] == [
        (0, 0, 1, True, "idle"), (0, 1, 1, False, "full"),
        (1, 0, 1, False, "full"), (1, 1, 2, True, "full"),
        (2, 0, 0, True, "idle"), (2, 1, 0, False, "full")]
    c = trace.counts()
    assert (c["dma"], c["no_dma"], c["no_dma_idle"], c["no_dma_work"]) == (3, 3, 0, 3)
    # in another row order the same step does need its DMA
    other = grid_trace(hand_plan, "b2", row_order=[2, 1, 0])
    assert [st.dma for st in other if st.i == 1 and st.s == 0] == [True]


def test_hand_plan_recording_agrees(hand_plan):
    recorded = recorded_grid_trace(hand_plan, "b3", random_seed=3)
    assert grid_trace(hand_plan, "b3", row_order=recorded.row_order).keys() == recorded.keys()


def test_bad_input_is_refused(tiny_plan):
    with pytest.raises(ValueError, match="b1, b2, b3"):
        grid_trace(tiny_plan, "dense")
    with pytest.raises(ValueError, match="each of the 3 query tiles once"):
        grid_trace(tiny_plan, "b2", row_order=[0, 0, 1])
    with pytest.raises(TypeError, match="TilePlan"):
        grid_trace(tiny_plan.mask, "b2")
    big = plan_tiles(get_preset("small").mask(), 128, 128)
    assert big.kv_index.size > RECORD_LIMIT_STEPS
    with pytest.raises(ValueError, match="smaller mask or larger blocks"):
        recorded_grid_trace(big, "b2")


@pytest.mark.parametrize("method", ["b1", "b3"])
def test_plot_traversal_marks_every_step(tiny_plan, method):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = grid_trace(tiny_plan, method)
    fig = plot_traversal(tiny_plan, method)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts]
    assert sorted(int(x) for x in labels if x.isdigit()) == list(range(len(trace)))
    scatters = [c for c in ax.collections if hasattr(c, "get_offsets") and len(c.get_offsets())
                and c.get_gid() not in ("tiles", "padding")]
    sizes = sorted(len(c.get_offsets()) for c in scatters)
    c = trace.counts()
    assert sizes == sorted([c["dma"], c["no_dma"]])
    assert str(c["steps"]) in ax.get_title() and method.upper() in ax.get_title()
    plt.close(fig)
