#!/usr/bin/env python3
"""Run notebooks' code cells, each notebook in a fresh Python process with one IPython shell: no Jupyter kernel.

Where a Jupyter kernel cannot start (a machine that allows no TCP socket, as the TPU machines this series
is measured on), this runs each notebook as a reader would, top to bottom in its own folder, and says per
notebook whether every cell ran (assertions included), which cell failed first and why, and how long
each cell took. Nothing is written into the notebooks.

    python tools/run-notebook-cells.py notebooks/0*.ipynb [--timeout 300] [--json PATH] [-p BLOCK_Q=512]
        [--record PATH --commit SHA]

`--record PATH` merges each notebook's row into a record of chip runs (svg_lib/data/tpu_notebook_runs.json's
form; a new file starts from that one) with today's date and `--commit`, where the notebook ran on the
record's chip; a run on another device is reported and left out.

`-p NAME=VALUE` sets a knob after the cell tagged `parameters`, as papermill does (VALUE read as a Python
literal). `--timeout` bounds each notebook (seconds); a notebook past it is reported as timed out.
Each notebook gets a process of its own, as a fresh Jupyter kernel would (a notebook that sets up
jax's devices must come first in its process), and a notebook stuck inside a compiled call is
still stopped at its timeout. Exit status 1 if any notebook failed or timed out.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class NotebookTimeout(Exception):
    pass


def knob(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    if not name.isidentifier() or not _:
        raise argparse.ArgumentTypeError(f"-p takes NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def run_notebook(path: Path, knobs: dict, timeout: float) -> dict:
    """Every code cell of `path` in a fresh IPython shell, in the notebook's folder."""
    from IPython.core.interactiveshell import InteractiveShell

    cells = json.loads(path.read_text())["cells"]
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    here = os.getcwd()
    os.chdir(path.parent)
    result = {"notebook": path.name, "cells": 0, "ok": True, "seconds": 0.0, "failed_cell": None, "error": None,
              "cell_seconds": []}
    start = time.perf_counter()

    def expire(*_):
        raise NotebookTimeout(f"past {timeout:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(timeout))
    try:
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            if "parameters" in cell.get("metadata", {}).get("tags", []) and knobs:
                source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in knobs.items())
            t = time.perf_counter()
            outcome = shell.run_cell(source, store_history=False)
            result["cell_seconds"].append([index, round(time.perf_counter() - t, 2)])
            result["cells"] += 1
            error = outcome.error_before_exec or outcome.error_in_exec
            if error is not None:
                if isinstance(error, NotebookTimeout):
                    raise error
                result.update(ok=False, failed_cell=index, error=f"{type(error).__name__}: {error}"[:2000])
                break
    except NotebookTimeout as e:
        result.update(ok=False, error=f"timed out: {e}", failed_cell="timeout")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(here)
        result["seconds"] = round(time.perf_counter() - start, 1)
        if "jax" in sys.modules:   # the device the notebook ran on, where it imported jax
            result["device_kind"] = sys.modules["jax"].devices()[0].device_kind
    return result


RECORD = Path(__file__).resolve().parents[1] / "svg_lib" / "data" / "tpu_notebook_runs.json"


def merge_into_record(path: Path, result: dict, commit: str) -> str:
    """`result` as a row of the chip-run record at `path` (a new file starts from RECORD): a line saying so."""
    import datetime

    record = json.loads((path if path.exists() else RECORD).read_text())
    if result.get("device_kind") != record["chip"]:
        return f"{result['notebook']}: not recorded, it ran on {result.get('device_kind')}, the record is {record['chip']}'s"
    slowest = max(result["cell_seconds"], key=lambda c: c[1], default=[None, 0.0])
    record["notebooks"][result["notebook"]] = {
        "ok": result["ok"], "seconds": result["seconds"], "code_cells_run": result["cells"],
        "failed_cell": result["failed_cell"], "slowest_cell": {"index": slowest[0], "seconds": slowest[1]},
        "date": datetime.date.today().isoformat(), "commit": commit}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return f"{result['notebook']}: recorded in {path}"


RESULT_MARK = "run-notebook-cells result: "


def in_own_process(path: Path, knobs: list, timeout: float) -> dict:
    """`run_notebook` in a fresh Python process; its output passes through, its result comes back."""
    command = [sys.executable, __file__, str(path), "--child", "--timeout", str(timeout)]
    command += [arg for name, value in knobs for arg in ("-p", f"{name}={value!r}")]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return {"notebook": path.name, "cells": None, "ok": False, "seconds": round(time.perf_counter() - start, 1),
                "failed_cell": "timeout", "error": f"timed out: the process outlived {timeout:.0f} s",
                "cell_seconds": []}
    lines = done.stdout.splitlines()
    sys.stdout.write("".join(line + "\n" for line in lines if not line.startswith(RESULT_MARK)))
    found = [line[len(RESULT_MARK):] for line in lines if line.startswith(RESULT_MARK)]
    if not found:
        return {"notebook": path.name, "cells": None, "ok": False, "seconds": round(time.perf_counter() - start, 1),
                "failed_cell": None, "error": f"the process died (exit status {done.returncode})", "cell_seconds": []}
    return json.loads(found[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook (default 300)")
    p.add_argument("--json", type=Path, help="write every notebook's result here (a missing folder is created)")
    p.add_argument("-p", dest="knobs", action="append", type=knob, default=[], metavar="NAME=VALUE")
    p.add_argument("--record", type=Path, help="merge each notebook's row into this record of chip runs")
    p.add_argument("--commit", help="the commit the notebooks ran at (with --record)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)   # one notebook, result on stdout
    args = p.parse_args(argv)
    if args.record and not args.commit:
        p.error("--record needs --commit SHA: the commit the notebooks ran at")
    missing = [str(n) for n in args.notebooks if not n.is_file()]
    if missing:
        p.error(f"no such notebook: {', '.join(missing)}")
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.child:
        print(RESULT_MARK + json.dumps(run_notebook(args.notebooks[0].resolve(), dict(args.knobs), args.timeout)))
        return 0
    results = []
    for path in args.notebooks:
        r = in_own_process(path.resolve(), args.knobs, args.timeout)
        results.append(r)
        verdict = "ok" if r["ok"] else f"FAILED at cell {r['failed_cell']}: {r['error'].splitlines()[0][:300]}"
        print(f"{r['notebook']}: {r['cells'] or 0} code cells, {r['seconds']:.1f} s, {verdict}", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        if args.record:
            print(merge_into_record(args.record, r, args.commit), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
