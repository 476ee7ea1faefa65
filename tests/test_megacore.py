"""Megacore chips (v4, v5p: two TensorCores joined as one jax device): what the compiler's static profile
of a v5p found.

The forward needs nothing of its own: a megacore shares the steps of all "parallel" grid axes, and the
forward's heads and query tiles are both parallel (svg_lib/data/megacore_split.json).
"""
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "svg_lib" / "data"


def test_the_committed_measurement_says_the_forward_grid_already_uses_both_cores():
    """The forward's default grid (heads and query tiles parallel) runs 1, 2 and 3 heads near half of one
    core's cycles on a v5p; with only the head axis parallel, one head takes one core's whole time and
    three heads two thirds of it (tools/megacore-split.py)."""
    data = json.loads((DATA / "megacore_split.json").read_text())
    assert data["target"] in ("v5p", "v4") and data["versions"]["libtpu"]
    rows = {(r["tokens"], r["heads"], r["form"]): r["cycles"] for r in data["rows"]}
    sizes = sorted({r["tokens"] for r in data["rows"]})
    assert len(sizes) >= 1 and min(sizes) >= 8192
    for tokens in sizes:
        for heads in (1, 2, 3):
            assert 0.45 < rows[tokens, heads, "default"] / rows[tokens, heads, "one_core"] < 0.55
        assert rows[tokens, 1, "heads_parallel"] / rows[tokens, 1, "one_core"] > 0.95
        assert 0.62 < rows[tokens, 3, "heads_parallel"] / rows[tokens, 3, "one_core"] < 0.72
