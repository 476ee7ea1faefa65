"""The record of what the kernels measured on a real TPU (svg_lib/data/tpu_measurements.json) and what
the code takes from it: the unroll rule agrees with every measured pair, and the claims the README and
notebooks print from it hold in it."""
import json
from pathlib import Path

import pytest

from svg_lib.instruments.tools.measured import (BODIES, best_splash, load_measurements, measured_table,
                                                shipped_loop, shipped_row, unroll_evidence)
from svg_lib.kernels import forward
from svg_lib.extensions.tolerances import tolerance

pytestmark = pytest.mark.lesson

ROWS = load_measurements()
ROOT = Path(__file__).resolve().parents[1]


def test_every_row_names_its_chip_versions_and_spread():
    assert ROWS
    for r in ROWS:
        for key in ("chip", "device_kind", "date", "jax", "jaxlib", "libtpu", "git_commit", "part"):
            assert r.get(key), (key, r)
        if "median_ms" in r:
            assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
            assert len(r["times_ms"]) == r["repeats"] >= 3


def test_the_unroll_rule_picks_the_fastest_loop_wherever_several_were_measured():
    evidence = unroll_evidence()
    assert {e["method"] for e in evidence} >= {"dense", "b1", "b2", "b3"}
    fast_slices = []
    for e in evidence:
        fastest = min(e["ms"].values())
        assert e["chosen"] in e["ms"], e                      # what the kernel compiles was measured
        assert e["ms"][e["chosen"]] <= 1.01 * fastest, e       # and is the fastest, within 1 %
        for loop, ms in e["ms"].items():
            over = e["slices"][loop] > forward.UNROLL_BUDGET
            assert (ms >= 2 * fastest) if over else (ms <= 1.1 * fastest), (loop, e)
            fast_slices += [] if over else [e["slices"][loop]]
    assert max(fast_slices) == forward.UNROLL_BUDGET  # the budget is the largest program measured fast


def test_shipped_loop_follows_the_kernels_rule():
    assert shipped_loop("b1", 3328, 1536, 512) == "unrolled" and shipped_loop("b3", 3328, 1536, 512) == "partly unrolled"
    assert shipped_loop("b3", 3328, 1536, 384) == "rolled"  # four slices: more than MAX_UNROLLED_CHUNKS
    assert shipped_loop("dense", 512, 512, 512) == "one slice" and shipped_loop("splash_dense", 3328, 1536, 512) is None
    assert {m: len(kinds) for m, kinds in BODIES.items()} == {"dense": 4, "b1": 2, "b2": 4, "b3": 4}


def test_the_case_studys_tiles_on_a_v5e_b3_fastest_b2_within_two_percent_of_b1():
    """What notebooks 03-06 and the README print from the record, checked against it."""
    ms = {m: shipped_row(m, 3328, 1536)["median_ms"] for m in ("splash_dense", "dense", "b1", "b2", "b3")}
    assert ms["b3"] == min(ms.values())
    assert ms["b2"] <= 1.02 * ms["b1"]
    assert ms["dense"] < best_splash()["median_ms"] <= ms["splash_dense"]


def test_the_table_shows_each_method_beside_the_model_and_the_case_study():
    table = measured_table()
    for label in ("B0 dense Splash", "svg_lib dense", "B1 naive", "B2 full/edge", "B3 tile-aligned", "96.37 ms"):
        assert label in table
    assert "v5e" in table and "compiled" in table and "jax 0.10.2" in table
    assert "nothing measured" in measured_table(640, 384)


def test_the_readmes_v5e_table_is_the_record():
    """Each figure of the README's measured table is the record's median at its tiles, to 0.1 ms."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("| stage | v5e, 3328 x 1536"):]
    header, _, *body = table.split("\n\n")[0].splitlines()
    tiles = [tuple(int(x) for x in t) for t in re.findall(r"v5e, (\d+) x (\d+)", header)]
    names = {"B0 dense Splash": "splash_dense", "svg_lib dense": "dense", "B1 naive sparse": "b1",
             "B2 full / edge tiles": "b2", "B3 tile-aligned": "b3"}
    checked = 0
    for line in body:
        cells = [c.strip() for c in line.strip("|").split("|")]
        method = names[cells[0]]
        for (bq, bkv), cell in zip(tiles, cells[1:]):
            assert float(cell.split()[0]) == pytest.approx(shipped_row(method, bq, bkv)["median_ms"], abs=0.05)
            checked += 1
    assert checked == 20


def test_every_notebook_has_a_run_on_a_tpu_on_record():
    """svg_lib/data/tpu_notebook_runs.json: one row per notebook of the series, each saying whether every
    cell ran on the chip; a notebook that failed there says why and what changed since."""
    record = json.loads((ROOT / "svg_lib" / "data" / "tpu_notebook_runs.json").read_text())
    assert {"chip", "date", "jax", "jaxlib", "libtpu", "commit", "mode"} <= set(record)
    shipped = {path.name for path in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(record["notebooks"]) == shipped
    for name, row in record["notebooks"].items():
        assert row["seconds"] > 0 and row["code_cells_run"] > 0, name
        assert row["ok"] or row.get("why"), f"{name} failed on the chip and the record does not say why"


def test_the_refined_log_sum_exp_is_what_the_chip_needed():
    """svg_lib/data/tpu_precision.json: the TPU's float32 log errs past what the float32 gradient tolerance
    allows, and the forward's refined log (one Newton step through exp) brings it within exp's error."""
    record = json.loads((ROOT / "svg_lib" / "data" / "tpu_precision.json").read_text())
    assert record["mode"] == "compiled" and {"device", "date", "jax", "jaxlib", "libtpu"} <= set(record)
    errors, gradients = record["errors"], tolerance("float32", "gradients")["atol"]
    assert errors["log"]["max_abs"] > gradients > errors["log_refined"]["max_abs"]
    assert errors["log_refined"]["max_abs"] <= 2 * errors["exp"]["max_abs"]
    assert record["gradients_after_refined_lse"]["after"]["value"] < gradients


def test_the_readme_quotes_the_notebook_runs_record():
    record = json.loads((ROOT / "svg_lib" / "data" / "tpu_notebook_runs.json").read_text())
    seconds = [row["seconds"] for row in record["notebooks"].values()]
    longest = sorted(record["notebooks"], key=lambda name: -record["notebooks"][name]["seconds"])[:2]
    readme = (ROOT / "README.md").read_text()
    assert f"seconds, {min(seconds):.0f} to {max(seconds):.0f} on the v5e" in " ".join(readme.split())
    assert sorted(name[:2] for name in longest) == ["04", "06"]
