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


def test_record_merges_a_row_only_for_the_records_chip(tmp_path):
    """--record: a new record starts from the committed one; a notebook run on another device (here the
    CPU) is reported and left out, so a CPU run can never pass for a chip run."""
    committed = json.loads((ROOT / "svg_lib" / "data" / "tpu_notebook_runs.json").read_text())
    path = notebook(tmp_path / "00_setup_and_tpu_primer.ipynb", "import jax", "print(jax.devices()[0].device_kind)")
    record = tmp_path / "record.json"
    command = [sys.executable, str(TOOL), str(path), "--timeout", "60", "--record", str(record), "--commit", "abc1234"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not recorded, it ran on cpu" in done.stdout
    assert not record.exists()
    missing = subprocess.run([sys.executable, str(TOOL), str(path), "--record", str(record)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--record needs --commit" in missing.stderr
    assert committed["chip"] == "TPU v5 lite"


def test_a_chip_run_replaces_its_notebooks_row_and_keeps_the_others(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_notebook_cells", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    committed = json.loads(tool.RECORD.read_text())
    result = {"notebook": "03_b1_naive_sparse.ipynb", "cells": 27, "ok": True, "seconds": 30.0, "failed_cell": None,
              "cell_seconds": [[1, 2.0], [5, 9.5]], "device_kind": committed["chip"]}
    record = tmp_path / "record.json"
    assert "recorded" in tool.merge_into_record(record, result, "abc1234")
    written = json.loads(record.read_text())
    row = written["notebooks"]["03_b1_naive_sparse.ipynb"]
    assert row["commit"] == "abc1234" and row["slowest_cell"] == {"index": 5, "seconds": 9.5}
    assert row["code_cells_run"] == 27 and row["seconds"] == 30.0
    others = {k: v for k, v in committed["notebooks"].items() if k != "03_b1_naive_sparse.ipynb"}
    assert {k: written["notebooks"][k] for k in others} == others
