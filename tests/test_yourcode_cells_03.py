"""Notebook 03's your-code cells: B1's key/value index map and B1's masked step. The checkers catch
typical wrong answers with a message naming the mistake, the solutions pass, and in the notebook a
wrong answer gets its verdict while a correct one (written differently from the solution) is what
the later cells run."""
import re

import numpy as np
import pytest
from jax.experimental import pallas as pl

from svg_lib.core.planner import EMPTY, FULL, PARTIAL, schedule_entry
from svg_lib.teaching.exercises import p03_b1
from yourcode_runner import run_with_pieces

NOTEBOOK = "03_b1_naive_sparse.ipynb"


def _ns(source):
    namespace = {"schedule_entry": schedule_entry, "pl": pl, "EMPTY": EMPTY, "FULL": FULL, "PARTIAL": PARTIAL}
    exec(source, namespace)
    return namespace


def packed_entry(h, i, s, schedule_ref, *, steps):          # the entry undecoded: tile << 2 | class
    n = i * steps + s
    return h, (schedule_ref[n >> 1] >> (16 * (n & 1))) & 0xFFFF, 0


def transposed(h, i, s, schedule_ref, *, steps):            # row and step swapped
    return h, schedule_entry(schedule_ref, s * steps + i)[0], 0


def idle_on_tile_one(h, i, s, schedule_ref, *, steps):      # idle steps fetch tile 1 (rows start on the sink, 0)
    import jax.numpy as jnp
    tile, cls = schedule_entry(schedule_ref, i * steps + s)
    return h, jnp.where(cls == EMPTY, 1, tile), 0


def off_by_one_row(h, i, s, schedule_ref, *, steps):        # i * (steps - 1) + s: small tiles can equal entries
    return h, schedule_entry(schedule_ref, i * (steps - 1) + s)[0], 0


def no_head(h, i, s, schedule_ref, *, steps):
    return 0, schedule_entry(schedule_ref, i * steps + s)[0], 0


def two_indices(h, i, s, schedule_ref, *, steps):            # the head left out
    return schedule_entry(schedule_ref, i * steps + s)[0], 0


def raw_word(h, i, s, schedule_ref, *, steps):              # the word's bits shifted, its two halves ignored
    return h, schedule_ref[i * steps + s] >> 2, 0


def class_for_tile(h, i, s, schedule_ref, *, steps):        # the decoder's two results swapped
    return h, schedule_entry(schedule_ref, i * steps + s)[1], 0


def element_offset(h, i, s, schedule_ref, *, steps):        # the first key's index, not the block's
    return h, schedule_entry(schedule_ref, i * steps + s)[0] * 128, 0


def class_tested(h, i, s, schedule_ref, *, steps):          # a Python test in an index map
    tile, cls = schedule_entry(schedule_ref, i * steps + s)
    if cls != EMPTY:
        return h, tile, 0
    return h, tile, 0


def entry_pair(h, i, s, schedule_ref, *, steps):            # the decoder's pair returned as one index
    return h, schedule_entry(schedule_ref, i * steps + s), 0


@pytest.mark.parametrize("wrong, message", [
    (entry_pair, "unpack it, tile, cls = schedule_entry"),
    (raw_word, "two 16-bit entries to a word"),
    (class_for_tile, "that is the step's class"),
    (element_offset, "a block index counts blocks, not elements"),
    (class_tested, "an index map tests nothing"),
    (two_indices, "return three block indices, (head, key tile, 0)"),
    (packed_entry, "the packed entry itself"),
    (transposed, "entry n = i * steps + s"),
    (idle_on_tile_one, "an idle step must fetch the tile its entry names"),
    (off_by_one_row, "entry n = i * steps + s"),
    (no_head, "the first block index picks the head"),
])
def test_kv_map_checker_names_the_mistake(wrong, message, capsys):
    result = p03_b1.check_b1_kv_map(wrong)
    assert not result.passed and message in result.message
    assert any(said in result.message for said in ("expected", "your kv_map raised", "is a pair"))  # what it got
    assert "_Fail" not in result.message and "it comes from your code" not in result.message
    if wrong is not packed_entry:
        assert "the packed entry itself" not in result.message


def every_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):        # idle steps too
    tile(keep, i * block_q, kv_tile * block_kv)


def offsets_from_s(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):    # k_start from the step counter
    pl.when(cls != EMPTY)(lambda: tile(keep, i * block_q, s * block_kv))


def q_offset_by_block_kv(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    pl.when(cls != EMPTY)(lambda: tile(keep, i * block_kv, kv_tile * block_kv))


def b2_split(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):         # B2's split, not B1
    pl.when(cls == FULL)(lambda: tile(None, i * block_q, kv_tile * block_kv))
    pl.when(cls == PARTIAL)(lambda: tile(keep, i * block_q, kv_tile * block_kv))


def keep_called(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):      # the predicate's values passed on
    import jax.numpy as jnp
    q_ids = i * block_q + jnp.arange(block_q)[:, None]
    k_ids = kv_tile * block_kv + jnp.arange(block_kv)[None, :]
    pl.when(cls != EMPTY)(lambda: tile(keep(q_ids, k_ids), i * block_q, kv_tile * block_kv))


def python_if(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    if cls != EMPTY:
        tile(keep, i * block_q, kv_tile * block_kv)


@pytest.mark.parametrize("wrong, message", [
    (every_step, "an idle step must leave the state alone"),
    (offsets_from_s, "k_start is the first token of the tile, kv_tile * block_kv"),
    (q_offset_by_block_kv, "q_start is the first token of the tile, i * block_q"),
    (b2_split, "B1 masks every visited tile, FULL ones too"),
    (python_if, "put the test in pl.when"),
    (keep_called, "tile takes the predicate itself"),
])
def test_step_checker_names_the_mistake(wrong, message, capsys):
    result = p03_b1.check_b1_step(wrong)
    assert not result.passed and message in result.message


def test_the_stubs_are_told_they_are_stubs(capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError("your code here")
    for check in (p03_b1.check_b1_kv_map, p03_b1.check_b1_step, p03_b1.check_b1_grid_spec):
        result = check(stub)
        assert not result.passed and "still the stub" in result.message


def test_the_solutions_pass(capsys):
    hints = (p03_b1.kv_map_hints(), p03_b1.step_hints(), p03_b1.grid_spec_hints())
    assert all(len(h.hints) >= 3 for h in hints)
    assert p03_b1.check_b1_kv_map(_ns(p03_b1.KV_MAP_SOLUTION)["kv_map"]).passed
    assert p03_b1.check_b1_step(_ns(p03_b1.STEP_SOLUTION)["b1_step"]).passed
    assert p03_b1.check_b1_grid_spec(_spec_ns(p03_b1.GRID_SPEC_SOLUTION)).passed


WRONG_MAP = '''def kv_map(h, i, s, schedule_ref, *, steps):
    return h, s, 0   # walks the key tiles like a dense grid'''
WRONG_STEP = '''def b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    tile(keep, i * block_q, kv_tile * block_kv)   # idle steps too'''
WRONG_SPEC = p03_b1.GRID_SPEC_SOLUTION.replace("pl.BlockSpec((None, block_kv, head_dim), kv_map)",
                                               "pl.BlockSpec((None, block_kv, head_dim), q_map)")   # k, v by query tile


def test_a_wrong_answer_in_the_notebook_gets_its_verdict():
    out = run_with_pieces(NOTEBOOK, {0: WRONG_MAP, 1: WRONG_STEP, 2: WRONG_SPEC}, stop_after=1)["outputs"]
    text = "\n".join(out)
    assert WRONG_SPEC != p03_b1.GRID_SPEC_SOLUTION
    assert "not yet: 03 kv_map" in text and "s counts the row's steps" in text
    assert "not yet: 03 b1_step" in text and "idle step must leave the state alone" in text
    assert "not yet: 03 b1_grid_spec" in text and "the k block follows the query tile" in text
    assert "The cells below run svg_lib's kv_map" in text and "svg_lib's b1_step" in text
    assert "The cells below run svg_lib's grid spec" in text and "PrefetchScalarGridSpec(" not in text


# correct, written differently from the solutions; each records what it was called with
RIGHT_MAP = '''from svg_lib.core.planner import schedule_entry

SEEN_SCHEDULES = set()


def kv_map(h, i, s, schedule_ref, *, steps):
    SEEN_SCHEDULES.add(int(schedule_ref.shape[0]))
    entry = schedule_entry(schedule_ref, s + steps * i)
    return h, entry[0], 0'''
RIGHT_STEP = '''SEEN_TILES = set()


def b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    SEEN_TILES.add((block_q, block_kv))
    visited = jnp.logical_or(cls == FULL, cls == PARTIAL)
    pl.when(visited)(lambda: tile(keep, q_start=block_q * i, k_start=block_kv * kv_tile))'''
RIGHT_SPEC = '''SEEN_GRIDS = set()


def b1_grid_spec(tables, *, heads, query_tiles, steps, block_q, block_kv, head_dim, kv_map, out_specs,
                 more_in_specs, more_scratch):
    SEEN_GRIDS.add((heads, query_tiles, steps))
    state = [pltpu.VMEM((block_q, 128), jnp.float32) for _ in "ml"]
    kv = pl.BlockSpec((None, block_kv, head_dim), kv_map)
    query = pl.BlockSpec((None, block_q, head_dim), lambda h, i, s, *refs: (h, i, 0))
    return pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=len(tables), grid=(heads, query_tiles, steps),
                                        in_specs=[query, kv, kv] + list(more_in_specs), out_specs=out_specs,
                                        scratch_shapes=state + [pltpu.VMEM((block_q, head_dim), jnp.float32),
                                                                *more_scratch])'''
PROBE = ("print(sorted(SEEN_SCHEDULES), sorted(SEEN_TILES), plan.schedule.size, blog_plan.schedule.size)\n"
         "print((config.heads, nq, plan.steps) in SEEN_GRIDS)")


def test_a_correct_answer_is_what_the_later_cells_run():
    result = run_with_pieces(NOTEBOOK, {0: "import jax.numpy as jnp\n" + RIGHT_MAP, 1: RIGHT_STEP, 2: RIGHT_SPEC},
                             probe=PROBE)
    text = "\n".join(result["outputs"])
    assert "passed: 03 kv_map" in text and "passed: 03 b1_step" in text and "passed: 03 b1_grid_spec" in text
    assert "The cells below run your kv_map." in text and "The cells below run your b1_step." in text
    assert "The cells below run your grid spec." in text and "num_scalar_prefetch=len(schedule.tables)" in text
    assert "B1 with your kv_map and your b1_step in your grid spec (interpret) matches" in text
    first, grids = result["probe"].strip().split("\n")
    assert grids == "True"                                         # the spec laid out the notebook's B1
    schedules, tiles, here, blog = re.fullmatch(r"(\[.*?\]) (\[.*?\]) (\d+) (\d+)\s*", first).groups()
    schedules, tiles = eval(schedules), eval(tiles)  # noqa: S307 (our own probe's output)
    assert int(here) in schedules and int(blog) in schedules      # this size's kernel and the case study's dry run
    assert (3328, 1536) in tiles                                   # the step ran at the case study's tiles
    assert "matches reference_attention" in text


def _spec_ns(source):
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu
    import jax
    namespace = {"pl": pl, "pltpu": pltpu, "jnp": jnp, "jax": jax}
    exec(source, namespace)
    return namespace["b1_grid_spec"]


def wrong_spec(old, new):
    """The solution with one mistake: `old` (which it must hold) replaced by `new`."""
    assert old in p03_b1.GRID_SPEC_SOLUTION
    return _spec_ns(p03_b1.GRID_SPEC_SOLUTION.replace(old, new))


@pytest.mark.parametrize("old, new, message", [
    ("num_scalar_prefetch=len(tables)", "num_scalar_prefetch=1", "num_scalar_prefetch=len(tables)"),
    ("grid=(heads, query_tiles, steps)", "grid=(heads, steps, query_tiles)", "the axes are swapped"),
    ("grid=(heads, query_tiles, steps)", "grid=(heads, query_tiles)", "an axis is missing"),
    ("pl.BlockSpec((None, block_q, head_dim), q_map)", "pl.BlockSpec((None, block_q, head_dim), kv_map)",
     "the q block follows the key tile"),
    ("head_dim), kv_map),\n                  pl.BlockSpec((None, block_kv, head_dim), kv_map)",
     "head_dim), q_map),\n                  pl.BlockSpec((None, block_kv, head_dim), q_map)",
     "the k block follows the query tile, not the schedule"),
    ("pl.BlockSpec((None, block_kv, head_dim), kv_map), *more",
     "pl.BlockSpec((None, block_kv, head_dim), lambda h, i, s, *t: (h, s, 0)), *more",
     "the v block walks the key tiles like a dense grid"),
    ("pl.BlockSpec((None, block_q, head_dim), q_map)", "pl.BlockSpec((block_q, head_dim), q_map)",
     "a leading None squeezes the head axis away"),
    ("pl.BlockSpec((None, block_kv, head_dim), kv_map),\n", "pl.BlockSpec((None, block_q, head_dim), kv_map),\n",
     "k blocks are block_kv rows"),
    ("pltpu.VMEM((block_q, head_dim), jnp.float32)", "pltpu.VMEM((block_q, head_dim), jnp.bfloat16)",
     "acc accumulates over many key tiles: float32"),
    ("pltpu.VMEM((block_q, 128), jnp.float32),        # m", "pltpu.VMEM((block_q, 1), jnp.float32),        # m",
     "scratch m is VMEM (128, 1) float32, expected VMEM (128, 128) float32"),
    ("                        *more_scratch]", "                        ]", "scratch_shapes has 3 entries, expected 4"),
    ("pltpu.VMEM((block_q, 128), jnp.float32),        # m", "pltpu.SMEM((block_q, 128), jnp.float32),        # m",
     "m lives in VMEM"),
    ("""pltpu.VMEM((block_q, 128), jnp.float32),        # m
                        pltpu.VMEM((block_q, 128), jnp.float32),        # l
                        pltpu.VMEM((block_q, head_dim), jnp.float32),   # acc""",
     """pltpu.VMEM((block_q, head_dim), jnp.float32),   # acc
                        pltpu.VMEM((block_q, 128), jnp.float32),        # m
                        pltpu.VMEM((block_q, 128), jnp.float32),        # l""",
     "the state's order is m, l, acc"),
    ("pltpu.VMEM((block_q, head_dim), jnp.float32)", "jax.ShapeDtypeStruct((block_q, head_dim), jnp.float32)",
     "scratch acc is a ShapeDtypeStruct, which says no memory space"),
    ("out_specs=out_specs", "out_specs=[]", "out_specs=out_specs, unchanged"),
    ("out_specs=out_specs", "out_specs=out_specs[0]", "your out_specs is a BlockSpec, not the list"),
])
def test_grid_spec_checker_names_the_mistake(old, new, message, capsys):
    result = p03_b1.check_b1_grid_spec(wrong_spec(old, new))
    assert not result.passed and message in result.message, result.message


def test_grid_spec_checker_names_the_library_scratch_put_first(capsys):
    source = p03_b1.GRID_SPEC_SOLUTION.replace("                        *more_scratch]", "                        ]")
    source = source.replace("scratch_shapes=[pltpu.VMEM", "scratch_shapes=[*more_scratch, pltpu.VMEM")
    assert source.count("more_scratch") == p03_b1.GRID_SPEC_SOLUTION.count("more_scratch")
    result = p03_b1.check_b1_grid_spec(_spec_ns(source))
    assert not result.passed and "the softmax state comes first" in result.message, result.message
