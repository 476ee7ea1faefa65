"""Run a notebook with its `your-code` cells swapped for other code: the tests of the spine's checkers.

`run_with_pieces(notebook, {index: source}, stop_after=None, probe=None)` executes `notebook` top to
bottom in a fresh kernel (this interpreter, working directory notebooks/), with the `index`-th cell
tagged `your-code` (0-based, in notebook order) replaced by `source`; `stop_after` ends the run after
that many cells past the last replaced one (a wrong answer's verdict needs no more); `probe`, a
source run as a last cell, whose printed output is returned with every cell's text output.
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def your_code_cells(nb) -> list:
    return [i for i, c in enumerate(nb.cells) if "your-code" in c.get("metadata", {}).get("tags", [])]


def run_with_pieces(notebook, pieces: dict, *, stop_after: int | None = None, probe: str | None = None,
                    timeout: int = 600) -> dict:
    """Returns {"outputs": [text of each executed cell], "probe": the probe's text}."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(ROOT / "notebooks" / notebook), as_version=4)
    cells = your_code_cells(nb)
    if not cells:
        raise ValueError(f"{notebook} has no cell tagged your-code")
    for index, source in pieces.items():
        nb.cells[cells[index]].source = source
    if stop_after is not None:
        last = max(cells[i] for i in pieces)
        nb.cells = nb.cells[:last + 1 + stop_after]
    if probe is not None:
        nb.cells.append(nbformat.v4.new_code_cell(probe))
    nb = copy.deepcopy(nb)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.km = None
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_cmd=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    km.start_kernel(cwd=str(ROOT / "notebooks"), env=env)
    try:
        client.km = km
        client.execute()
    finally:
        km.shutdown_kernel(now=True)
    texts = []
    for cell in nb.cells:
        text = ""
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text += out.get("text", "")
            elif "data" in out and "text/plain" in out["data"]:
                text += out["data"]["text/plain"]
        texts.append(text)
    return {"outputs": texts, "probe": texts[-1] if probe is not None else None}
