"""The your-code cells' shared pieces: hints one at a time, the piece the cells below run, the cost line."""
import re

import pytest

from svg_lib.core.planner import FULL, PARTIAL, plan_tiles
from svg_lib.problem import get_preset
from svg_lib.teaching.exercises.common import CheckResult
from svg_lib.teaching.yourcode import Hints, choose, cost_line, whose


def test_hints_come_one_at_a_time_then_the_solution(capsys):
    hints = Hints("a piece", ("first", "second", "third"), "def piece(): ...")
    shown = []
    for _ in range(5):
        assert hints.next() is None   # printed once, not echoed again as the cell's value
        shown.append(capsys.readouterr().out.rstrip("\n"))
    assert shown[:3] == ["Hint 1 of 3: first", "Hint 2 of 3: second", "Hint 3 of 3: third"]
    assert shown[3] == shown[4] == "Solution:\ndef piece(): ..."
    with pytest.raises(ValueError, match="at least three hints"):
        Hints("a piece", ("only", "two"), "...")


def test_choose_runs_the_learners_piece_only_when_it_passed(capsys):
    yours, library = object(), object()
    assert choose(CheckResult("x", True, "passed"), yours, library, piece="B1 step") is yours
    assert "run your B1 step" in capsys.readouterr().out
    assert choose(CheckResult("x", False, "not yet"), yours, library, piece="B1 step") is library
    assert "svg_lib's B1 step until yours passes" in capsys.readouterr().out


def test_whose_names_the_piece_that_ran():
    assert whose(CheckResult("x", True, "passed"), "tile body") == "your tile body"
    assert whose(CheckResult("x", False, "not yet"), "tile body") == "svg_lib's tile body"


@pytest.mark.parametrize("block_q, block_kv", [(256, 128), (128, 256), (512, 128)])
def test_cost_line_counts_the_plans_tiles(block_q, block_kv):
    mask = get_preset("walkthrough").mask()
    plan = plan_tiles(mask, block_q, block_kv)
    full, partial = int((plan.step_class == FULL).sum()), int((plan.step_class == PARTIAL).sum())
    b1 = cost_line(mask, "b1", block_q, block_kv)
    b2 = cost_line(mask, "b2", block_q, block_kv)
    assert f"{full + partial:,} tiles visited, {full + partial:,} masked" in b1
    assert f"{full + partial:,} tiles visited, {partial:,} masked" in b2
    assert f"{plan.grid[0] * plan.steps:,} grid steps" in b2
    floors = dict(re.findall(r"(v5e|v6e) ([\d.]+) ms", b2))   # no static profile at these small tiles: the floor
    assert "MXU floor" in b2 and set(floors) == {"v5e", "v6e"} and float(floors["v6e"]) < float(floors["v5e"])
    flops = (full + partial) * 4 * block_q * block_kv * 128
    assert float(floors["v5e"]) == pytest.approx(flops / 197e12 * 1e3, abs=1e-3)


def test_cost_line_predicts_time_where_the_profile_was_committed():
    config = get_preset("blog")
    line = cost_line(config.mask(), "b3", config.block_q, config.block_kv, heads=config.heads)
    times = dict(re.findall(r"(v5e|v6e) ([\d.]+) ms", line))
    assert set(times) == {"v5e", "v6e"} and float(times["v6e"]) < float(times["v5e"])
    assert "simulated" in line
    measured = re.search(r"measured on a TPU v5e .*: ([\d.]+) ms median", line)
    assert measured and float(measured.group(1)) > float(times["v5e"]) * 0.5  # the record's B3 at these tiles
