"""tools/execute-notebooks.py --check --expect: how the Colab replica insists that a step it cannot see
(a cell that catches an error so a reader can go on) really worked."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

TOOL = Path(__file__).resolve().parents[1] / "tools" / "execute-notebooks.py"


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), "--check", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_expect_fails_a_notebook_that_ran_but_did_not_print_the_text(tmp_path):
    path = tmp_path / "caught.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("try:\n    raise RuntimeError('refused')\nexcept RuntimeError:\n"
                                          "    print('skipped')\nelse:\n    print('32 s to compile')")]
    nbformat.write(nb, path)
    before = path.read_text()

    ran = _run(path, "--expect", "caught.ipynb=skipped")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    missed = _run(path, "--expect", "caught.ipynb= s to compile")
    assert missed.returncode == 1 and "never printed ' s to compile'" in missed.stdout, missed.stdout
    assert path.read_text() == before  # --check writes nothing

    wrong = _run(path, "--expect", "other.ipynb=text")  # a name that is not among the notebooks
    assert wrong.returncode == 2 and "NAME=TEXT" in wrong.stderr
