"""tools/run-notebook-cells.py, the way notebooks are run on a TPU machine where no Jupyter kernel starts:
each notebook in a process of its own, the first failing cell named, knobs set after `parameters`."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "run-notebook-cells.py"

pytestmark = pytest.mark.lesson


def notebook(path: Path, *sources, parameters=None) -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# a notebook"}]
    if parameters is not None:
        cells.append({"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": parameters,
                      "outputs": [], "execution_count": None})
    cells += [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
              for s in sources]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def run(tmp_path, *paths, knobs=()):
    out = tmp_path / "runs" / "result.json"
    command = [sys.executable, str(TOOL), *map(str, paths), "--timeout", "60", "--json", str(out)]
    command += [arg for knob in knobs for arg in ("-p", knob)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    return done, json.loads(out.read_text())


def test_names_the_first_failing_cell_and_runs_each_notebook_in_its_own_process(tmp_path):
    # the second notebook sees none of the first one's names: a process of its own
    first = notebook(tmp_path / "first.ipynb", "seen = 1", "assert seen == 2, 'seen is one'", "never = 1")
    second = notebook(tmp_path / "second.ipynb", "assert 'seen' not in globals()", "print('fine')")
    done, results = run(tmp_path, first, second)
    assert done.returncode == 1
    assert [r["notebook"] for r in results] == ["first.ipynb", "second.ipynb"]
    assert results[0]["ok"] is False and results[0]["failed_cell"] == 2 and "seen is one" in results[0]["error"]
    assert results[0]["cells"] == 2          # the cell after the failure did not run
    assert results[1]["ok"] is True and results[1]["cells"] == 2
    assert "fine" in done.stdout


def test_knobs_are_set_after_the_parameters_cell(tmp_path):
    path = notebook(tmp_path / "knobs.ipynb", "assert BLOCK_Q == 512, BLOCK_Q", parameters="BLOCK_Q = 256")
    done, results = run(tmp_path, path, knobs=("BLOCK_Q=512",))
    assert done.returncode == 0 and results[0]["ok"], results
