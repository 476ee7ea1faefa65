#!/usr/bin/env python3
"""Write tools/setup-cell.py into every notebook's setup cell (the first code cell, or the part of it
from its "# Setup: make" line on), outputs untouched. tests/test_notebook_setup.py checks they agree.

    python tools/set-setup-cell.py notebooks/*.ipynb notebooks/exercises/*.ipynb notebooks/exercises/solutions/*.ipynb
"""
import sys
from pathlib import Path

import nbformat

SETUP = (Path(__file__).parent / "setup-cell.py").read_text().rstrip("\n")
MARK = "# Setup: make"

for name in sys.argv[1:]:
    nb = nbformat.read(name, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    before, mark, _ = cell.source.partition(MARK)
    if not mark:
        sys.exit(f"{name}: the first code cell has no '{MARK}' line")
    new = before + SETUP
    if new != cell.source:
        cell.source = new
        nbformat.write(nb, name)
        print(f"{name}: setup cell written")
