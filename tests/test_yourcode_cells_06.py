"""Notebook 06's your-code cell: B3's rounding, its checker, and the notebook running the learner's rounding."""
import numpy as np
import pytest

from svg_lib.problem import get_preset
from svg_lib.teaching.exercises.p06_rounding import (ROUNDING_HINTS, check_rounding, svg_lib_rounding,
                                                     tile_aligned_with)

NOTEBOOK = "06_b3_tile_aligned.ipynb"
MASK = get_preset("walkthrough").mask()


def _solution():
    namespace = {"np": np}
    exec(ROUNDING_HINTS.solution, namespace)
    return namespace["balanced_rounding"]


def _prefix(key, how_many, reverse_ties=False):
    """A rounding that ranks by `key(kept, area)` and keeps a prefix chosen by `how_many(totals, budget)`
    (`reverse_ties`: an ascending sort reversed, which puts tied tiles in reverse index order)."""
    def rounding(kept, area, budget):
        order = (np.argsort(key(kept, area), kind="stable")[::-1] if reverse_ties
                 else np.argsort(-key(kept, area), kind="stable"))
        totals = np.concatenate([[0], np.cumsum(area[order])])
        chosen = np.zeros(len(kept), dtype=bool)
        chosen[order[:how_many(totals, budget)]] = True
        return chosen
    return rounding


closest = lambda totals, budget: int(np.argmin(np.abs(totals - budget)))  # noqa: E731


def _kept_totals(kept, area, budget):        # the ranking's running totals summed over kept pairs
    order = np.argsort(-kept / area, kind="stable")
    totals = np.concatenate([[0], np.cumsum(kept[order])])
    chosen = np.zeros(len(kept), dtype=bool)
    chosen[order[:closest(totals, budget)]] = True
    return chosen


def _no_empty_prefix(kept, area, budget):    # candidates start at one tile: fails where there is none
    order = np.argsort(-kept / area, kind="stable")
    totals = np.cumsum(area[order])
    chosen = np.zeros(len(kept), dtype=bool)
    chosen[order[:closest(totals, budget) + 1]] = True
    return chosen
WRONG = {
    "still the stub": (lambda kept, area, budget: (_ for _ in ()).throw(NotImplementedError("your code here")),
                       "replace the `raise NotImplementedError`"),
    "indices, not flags": (lambda kept, area, budget: np.argsort(-kept / area)[:2], "not the indices"),
    "every boundary tile kept": (lambda kept, area, budget: np.ones(len(kept), bool), "rounding every boundary tile up"),
    "ranked by count, not fraction": (_prefix(lambda k, a: k, closest), "the fraction, not the number"),
    "never over the budget": (_prefix(lambda k, a: k / a, lambda t, b: int((t <= b).sum()) - 1), "on either side of it"),
    "prefix totals of kept, not area": (_kept_totals, "summed over kept, every prefix stays within the budget"),
    "no empty prefix": (_no_empty_prefix, "count the empty prefix among the candidates"),
    "ties reversed": (_prefix(lambda k, a: k / a, closest, reverse_ties=True), "ties in the ranking keep index order"),
}


@pytest.mark.parametrize("name", WRONG)
def test_the_checker_names_each_typical_mistake(name):
    fn, hint = WRONG[name]
    result = check_rounding(fn, MASK, 256, 128)
    assert not result.passed and result.message.startswith("not yet") and hint in result.message, result.message


def test_the_solution_and_svg_libs_piece_pass_and_round_as_the_library_does():
    assert len(ROUNDING_HINTS.hints) >= 3 and "def balanced_rounding" in ROUNDING_HINTS.solution
    for fn in (_solution(), svg_lib_rounding):
        assert check_rounding(fn, MASK, 512, 128).passed
    blog = get_preset("blog")
    for mask, bq, bkv in ((MASK, 256, 128), (MASK, 128, 256), (blog.mask(), blog.block_q, blog.block_kv)):
        ours, library = tile_aligned_with(mask, bq, bkv, svg_lib_rounding), mask.tile_aligned(bq, bkv)
        assert np.array_equal(ours.kept, library.kept) and ours.report == library.report
    with pytest.raises(ValueError, match="one bool per boundary tile"):
        tile_aligned_with(MASK, 256, 128, lambda kept, area, budget: np.arange(3))


def test_a_wrong_rounding_gets_its_verdict_in_the_notebook():
    from yourcode_runner import run_with_pieces

    wrong = "import numpy as np\ndef balanced_rounding(kept, area, budget):\n    return np.ones(len(kept), bool)\n"
    out = "".join(run_with_pieces(NOTEBOOK, {0: wrong}, stop_after=1)["outputs"])
    assert "not yet: B3 rounding fails" in out and "svg_lib's B3 rounding until yours passes" in out


def test_a_correct_rounding_runs_to_the_end_and_the_cells_below_use_it():
    from yourcode_runner import run_with_pieces

    counted = ("import numpy as np\nCALLS = [0]\n" + ROUNDING_HINTS.solution
               + "\n_theirs = balanced_rounding\ndef balanced_rounding(kept, area, budget):\n"
               "    CALLS[0] += 1\n    return _theirs(kept, area, budget)\n")
    run = run_with_pieces(NOTEBOOK, {0: counted}, probe="print('calls', CALLS[0], rounding is balanced_rounding)")
    out = "".join(run["outputs"])
    assert "The cells below run your B3 rounding." in out and "B3 on your rounding" in out
    calls = int(run["probe"].split()[1])
    # the checker's cases, then the tile maps, the case study's plan and the explorer's builder
    assert calls >= 19 + 2 and run["probe"].split()[2] == "True"
