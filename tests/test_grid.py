"""The tile step's pieces (kernels.grid) that run without tracing a kernel: the sizes' checks and the
schedule's one decoder, read here from a NumPy table as the kernels read it from SMEM."""
import numpy as np
import pytest

from svg_lib.core.planner import EMPTY, FULL, PARTIAL, pack_schedule, unpack_schedule
from svg_lib.kernels.grid import DenseKeyMajor, DenseSchedule, KeyMajor, Schedule, ScheduleRows, TileSizes


def test_tile_sizes_are_checked_and_count_their_slices():
    assert TileSizes(256, 512, 128).slices == 4
    with pytest.raises(ValueError, match="must divide block_kv"):
        TileSizes(256, 512, 384)
    with pytest.raises(ValueError, match="block_q must be a positive int"):
        TileSizes(0, 512, 512)


def test_schedule_rows_decode_what_the_planner_packed():
    kv = np.array([[0, 2, 2], [1, 0, 0]])
    classes = np.array([[FULL, PARTIAL, EMPTY], [PARTIAL, FULL, EMPTY]])
    rows = ScheduleRows.checked("the schedule", pack_schedule(kv, classes), rows=2, steps=3)
    decoded = [[tuple(int(x) for x in rows.entry(rows.table, r, s)) for s in range(3)] for r in range(2)]
    assert decoded == [[(int(t), int(c)) for t, c in zip(kv[r], classes[r])] for r in range(2)]
    assert all((a == b).all() for a, b in zip(unpack_schedule(rows.table, 2, 3), (kv, classes)))
    with pytest.raises(ValueError, match=r"the schedule must be int32 \[3\] for 2 rows x 3 steps"):
        ScheduleRows.checked("the schedule", np.zeros(4, np.int32), rows=2, steps=3)


def test_a_forward_schedule_reads_each_head_kind_rows():
    # two kinds of head, two query tiles, two steps: head 1 follows kind 1's rows
    kv = np.array([[0, 1], [1, 0], [2, 2], [3, 3]])
    classes = np.full((4, 2), PARTIAL)
    plan = Schedule.checked((2, 200, 64), np.array([0, 1]), pack_schedule(kv, classes), steps=2, kinds=2,
                            block_q=128)
    tables = dict(head_kind_ref=plan.head_kind, schedule_ref=plan.packed.table, head_order_ref=None)
    assert [int(plan.entry(1, i, s, **tables)[0]) for i in (0, 1) for s in (0, 1)] == [2, 2, 3, 3]
    assert plan.q_map(1, 1, 0, **tables) == (1, 1, 0)
    with pytest.raises(ValueError, match="head_kind int32 \\[3\\]"):
        Schedule.checked((3, 200, 64), np.array([0, 1]), pack_schedule(kv, classes), steps=2, kinds=2, block_q=128)


def test_the_backward_walks_read_one_kind_and_key_major_trades_the_maps():
    """The backward's schedules: one kind, no head_kind table (row i of the table); key-major, the entry
    names the query block and the row is the key block's; dense key-major, key tile j's padding class."""
    kv = np.array([[0, 1], [1, 1]])
    classes = np.array([[FULL, PARTIAL], [PARTIAL, EMPTY]])
    rows = ScheduleRows.checked("the schedule", pack_schedule(kv, classes), rows=2, steps=2)
    tables = dict(head_kind_ref=None, schedule_ref=rows.table, head_order_ref=None)
    query_major, key_major = Schedule(None, rows, 2), KeyMajor(None, rows, 2)
    assert query_major.tables == key_major.tables == (rows.table,)
    assert query_major.prefetch == (("head_kind", False), "schedule", ("head_order", False))
    assert [int(query_major.entry(0, 1, s, **tables)[0]) for s in (0, 1)] == [1, 1]
    assert query_major.q_map(3, 1, 0, **tables) == key_major.kv_map(3, 1, 0, **tables) == (3, 1, 0)
    assert query_major.kv_map(3, 0, 1, **tables) == key_major.q_map(3, 0, 1, **tables) == (3, 1, 0)
    dense, dense_t = DenseSchedule(3, 2, 128, 200), DenseKeyMajor(2, 3, 128, 200)  # key tile 1 is padded
    assert (dense.q_map(0, 2, 1), dense.kv_map(0, 2, 1)) == (dense_t.kv_map(0, 2, 1), dense_t.q_map(0, 2, 1))
    assert [int(dense_t.entry(0, j, 2)[1]) for j in (0, 1)] == [FULL, PARTIAL] and dense_t.tables == ()
