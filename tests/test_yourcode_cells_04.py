"""Notebook 04's your-code cell: B2's dispatch, checked by exercise E3's checker. It catches typical
wrong answers with a message naming the mistake, the solution passes, and in the notebook a wrong
answer gets its verdict while a correct one (written differently from the solution) is what the
later cells run."""
import pytest
from jax.experimental import pallas as pl

from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.problem import get_preset
from svg_lib.teaching.exercises import p04_b2_dispatch
from test_exercises import e3_b1_dispatch, e3_idle_steps_computed, e3_nothing_masked, e3_python_if
from yourcode_runner import run_with_pieces

NOTEBOOK = "04_b2_full_edge_tiles.ipynb"


# the typical wrong answers exercise E3's tests already hold; here through the notebook's module, with the hints
b1_style, idle_masked, never_masked, python_if = (e3_b1_dispatch, e3_idle_steps_computed, e3_nothing_masked,
                                                  e3_python_if)


@pytest.mark.parametrize("wrong, message", [
    (b1_style, "evaluating it anyway is the per-element VPU work B1 pays"),
    (never_masked, "without keep, its dropped pairs leak into the softmax"),
    (idle_masked, "an idle step must compute nothing"),
    (python_if, "wrap each branch in pl.when"),
])
def test_dispatch_checker_names_the_mistake(wrong, message, capsys):
    result = p04_b2_dispatch.check_b2_dispatch(wrong)
    assert not result.passed and message in result.message


def swapped_bodies(step_class, tile, keep):
    pl.when(step_class == FULL)(lambda: tile(keep=keep))
    pl.when(step_class == PARTIAL)(lambda: tile(keep=None))


def codes_not_names(step_class, tile, keep):   # B1's test, written with EMPTY's code
    pl.when(step_class != 0)(lambda: tile(keep=keep))


def test_dispatch_checker_names_swapped_bodies_and_codes_only_where_used(capsys):
    from svg_lib.teaching.exercises.e3_b2_dispatch import CODES_NOTE

    assert EMPTY == 0   # codes_not_names is B1's dispatch only while EMPTY's code is 0
    swapped = p04_b2_dispatch.check_b2_dispatch(swapped_bodies)
    assert not swapped.passed and "your two bodies are swapped" in swapped.message
    codes, names = (p04_b2_dispatch.check_b2_dispatch(fn) for fn in (codes_not_names, b1_style))
    assert not codes.passed and not names.passed
    assert CODES_NOTE in codes.message and CODES_NOTE not in names.message


def test_the_dry_run_shows_what_a_dispatch_runs_at_the_case_studys_size():
    blog = get_preset("blog")
    plan = plan_tiles(blog.mask(), blog.block_q, blog.block_kv)
    resident, right = p04_b2_dispatch.b2_dry_run(plan, p04_b2_dispatch.library_b2_dispatch)
    _, wrong = p04_b2_dispatch.b2_dry_run(plan, b1_style)
    free, masked = p04_b2_dispatch.MASK_FREE_PATH, p04_b2_dispatch.MASKED_PATH
    assert (resident == plan.kv_index).all()
    assert ((right == free) == (plan.step_class == FULL)).all()
    assert ((right == masked) == (plan.step_class == PARTIAL)).all()
    assert int((wrong == masked).sum()) == int(plan.visited.sum()) > int((right == masked).sum())


def test_the_solution_and_the_library_pass(capsys):
    namespace = {"pl": pl, "EMPTY": EMPTY, "FULL": FULL, "PARTIAL": PARTIAL}
    exec(p04_b2_dispatch.DISPATCH_SOLUTION, namespace)
    assert p04_b2_dispatch.check_b2_dispatch(namespace["b2_dispatch"]).passed
    assert p04_b2_dispatch.check_b2_dispatch(p04_b2_dispatch.library_b2_dispatch).passed
    assert len(p04_b2_dispatch.dispatch_hints().hints) >= 3


def test_a_wrong_answer_in_the_notebook_gets_its_verdict():
    wrong = "from jax.experimental import pallas as pl\n\n\n" + \
            "def b2_dispatch(step_class, tile, keep):\n    pl.when(step_class != EMPTY)(lambda: tile(keep=keep))"
    text = "\n".join(run_with_pieces(NOTEBOOK, {0: wrong}, stop_after=1)["outputs"])
    assert "not yet: 04 b2_dispatch" in text and "the per-element VPU work B1 pays" in text
    assert "The cells below run svg_lib's b2_dispatch until yours passes" in text


# correct, written differently from the solution; it counts the kernels it is traced into
RIGHT = '''from jax.experimental import pallas as pl

CALLS = [0]


def b2_dispatch(step_class, tile, keep):
    CALLS[0] += 1
    for cls, k in ((PARTIAL, keep), (FULL, None)):
        pl.when(step_class == cls)(lambda k=k: tile(keep=k))'''


def test_a_correct_answer_is_what_the_later_cells_run(capsys):
    namespace = {"EMPTY": EMPTY, "FULL": FULL, "PARTIAL": PARTIAL}
    exec(RIGHT, namespace)
    assert p04_b2_dispatch.check_b2_dispatch(namespace["b2_dispatch"]).passed
    by_the_check = namespace["CALLS"][0]                # the calls the check cell alone makes
    result = run_with_pieces(NOTEBOOK, {0: RIGHT}, probe="print(CALLS[0])")
    text = "\n".join(result["outputs"])
    assert "passed: 04 b2_dispatch" in text and "The cells below run your b2_dispatch." in text
    assert int(result["probe"]) > by_the_check          # the dry run, the tile map and the timing ran it too
    assert "matches reference_attention" in text and "the dispatch at the case study's size" in text


def test_an_output_holding_nan_is_named_as_such_not_blamed_on_keep(monkeypatch):
    """Where every step ran its path but the kernel's output holds NaN, the checker says so and what could
    cause it, rather than the finite-mismatch hint."""
    import numpy as np
    from svg_lib.teaching.exercises import e3_b2_dispatch

    real = e3_b2_dispatch.b2_exercise_attention

    def poisoned(*args, **kwargs):
        out, paths, plan = real(*args, **kwargs)
        return np.asarray(out).copy() * np.where(np.arange(out.shape[1]) == 5, np.nan, 1.0)[None, :, None], paths, plan

    monkeypatch.setattr(e3_b2_dispatch, "b2_exercise_attention", poisoned)
    result = p04_b2_dispatch.check_b2_dispatch(p04_b2_dispatch.library_b2_dispatch)
    assert not result.passed and "are inf or NaN" in result.message and "svg_lib's kernel is at fault" in result.message
