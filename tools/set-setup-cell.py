#!/usr/bin/env python3
"""Write tools/setup-cell.py into every notebook's setup cell (the first code cell holding its
"# Setup: make" line, from that line on), outputs untouched. The setup cell's REPOSITORY_URL line is
first set from the file REPOSITORY_URL at the repository's root, the one place that names the
repository. tests/test_notebook_setup.py checks they agree.

    python tools/set-setup-cell.py notebooks/*.ipynb notebooks/exercises/*.ipynb notebooks/exercises/solutions/*.ipynb
"""
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CELL = ROOT / "tools" / "setup-cell.py"
URL = (ROOT / "REPOSITORY_URL").read_text().strip()
SETUP, count = re.subn(r'^REPOSITORY_URL = ".*?"', f'REPOSITORY_URL = "{URL}"', CELL.read_text(), count=1, flags=re.M)
if count != 1:
    sys.exit(f"{CELL}: no 'REPOSITORY_URL = \"...\"' line to set")
if SETUP != CELL.read_text():
    CELL.write_text(SETUP)
    print(f"{CELL.relative_to(ROOT)}: REPOSITORY_URL set to {URL}")
SETUP = SETUP.rstrip("\n")
MARK = "# Setup: make"

for name in sys.argv[1:]:
    nb = nbformat.read(name, as_version=4)
    cell = next((c for c in nb.cells if c.cell_type == "code" and MARK in c.source), None)
    if cell is None:
        sys.exit(f"{name}: no code cell has a '{MARK}' line")
    before, mark, _ = cell.source.partition(MARK)
    new = before + SETUP
    if new != cell.source:
        cell.source = new
        nbformat.write(nb, name)
        print(f"{name}: setup cell written")
