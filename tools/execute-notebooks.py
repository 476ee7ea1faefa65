#!/usr/bin/env python3
"""Execute notebooks top to bottom, the way their committed outputs are made, or as a reader would.

    .venv/bin/python tools/execute-notebooks.py notebooks/03_b1_naive_sparse.ipynb [...]
    python tools/execute-notebooks.py --cwd /content --check notebooks/*.ipynb

By default each notebook runs with nbclient in its own folder (as nbval does) and is written back
in place, without the per-cell execution timestamps that nbclient records, so a re-run changes
only what the cells print. With --check nothing is written: the script runs every notebook, says
which cell of which failed, and exits 1 if any did. --cwd runs the kernels in another working
directory, as on Colab, where a notebook opened from GitHub starts in /content, not beside its
repository. --jobs N runs N notebooks at a time (each in its own process and kernel). --expect
NAME=TEXT fails the run unless notebook NAME (its file name) printed TEXT: where a cell catches an
error to let a reader go on, a checker can still insist that the step worked.
"""
import argparse
import concurrent.futures
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(path: Path, cwd: Path | None = None, write: bool = True) -> tuple[float, str]:
    """Run one notebook; its seconds and the text its cells printed."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd or path.parent)}}).execute()
    seconds = time.perf_counter() - start
    printed = "".join(output.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                      for output in cell.get("outputs", ()) if output.get("output_type") == "stream")
    if write:
        for cell in nb.cells:
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
    return seconds, printed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--cwd", type=Path, help="the kernels' working directory (default: each notebook's folder)")
    parser.add_argument("--check", action="store_true", help="run only: write nothing, exit 1 if any notebook fails")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at a time (0: one per core of this process's CPUs)")
    parser.add_argument("--expect", action="append", default=[], metavar="NAME=TEXT",
                        help="fail unless the notebook whose file name is NAME printed TEXT (repeatable)")
    args = parser.parse_args(argv)
    expected = {}
    for item in args.expect:
        name, sep, text = item.partition("=")
        if not sep or not text or name not in {path.name for path in args.notebooks}:
            parser.error(f"--expect {item!r}: give NAME=TEXT with NAME the file name of a notebook to run")
        expected.setdefault(name, []).append(text)
    jobs = args.jobs or len(os.sched_getaffinity(0))
    failed = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = {pool.submit(execute, path, args.cwd, not args.check): path for path in args.notebooks}
        for run in concurrent.futures.as_completed(runs):
            path = runs[run]
            try:
                seconds, printed = run.result()
                print(f"{path}: {seconds:.1f} s", flush=True)
                missing = [text for text in expected.get(path.name, ()) if text not in printed]
                if missing:
                    failed.append(path)
                    print(f"{path}: FAILED: it ran, but never printed {', '.join(map(repr, missing))}", flush=True)
            except CellExecutionError as err:
                if not args.check:
                    raise
                failed.append(path)
                print(f"{path}: FAILED\n{str(err)[-3000:]}", flush=True)
    if failed:
        print(f"{len(failed)} of {len(args.notebooks)} notebooks failed: {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
