#!/usr/bin/env python3
"""Execute notebooks top to bottom in place, the way their committed outputs are made.

    .venv/bin/python tools/execute-notebooks.py notebooks/03_b1_naive_sparse.ipynb [...]

Runs each notebook with nbclient in its own folder (as nbval does), then drops the per-cell
execution timestamps that nbclient records, so a re-run changes only what the cells print.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return seconds


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for name in sys.argv[1:]:
        print(f"{name}: {execute(Path(name)):.1f} s", flush=True)
