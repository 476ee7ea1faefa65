#!/usr/bin/env python3
"""Compile every forward program the TPU record measured, compile-only for its chip, and write how many bytes
of code the compiler generated for each (`memory_analysis().generated_code_size_in_bytes`) to
svg_lib/data/tpu_code_sizes.json. No TPU needed: libtpu compiles for the chip from the CPU.

The kernels' unroll rule (`kernels.forward.unrolled_bodies`) prices a program by a fit of these sizes
(`forward.code_bytes`); the record's times say which sizes ran fast (`tests/test_measurements.py`).
Each program is built at the case study's problem with the kinds of tile body its measured row unrolled.

    PYTHONPATH=$PWD python tools/code-sizes.py [--chip v5e] [--out PATH] [--missing]

`--missing` keeps the programs already in `--out` and compiles only those the record measured since (each
added row carries its own date and commit).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata as md
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_OUT = REPO / "svg_lib" / "data" / "tpu_code_sizes.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chip", default="v5e")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--missing", action="store_true", help="keep --out's programs, compile only the new ones")
    args = p.parse_args(argv)

    from svg_lib.instruments.tools.measured import (BODIES, body_names, load_measurements, program_unrolled,
                                                     row_unrolled)
    from svg_lib.instruments.tools.report import git_commit
    from svg_lib.instruments.tpu.compiler import compile_for_tpu
    from svg_lib.kernels import forward
    from svg_lib.problem import get_preset
    from svg_lib.progress import bar as progress_bar

    programs = sorted({(r["method"], r["block_q"], r["block_kv"], r["block_kv_compute"],
                        tuple(sorted(BODIES[r["method"]] & row_unrolled(r))))
                       for r in load_measurements() if r.get("chip") == args.chip and r.get("part") == "forward"
                       and r.get("method") in BODIES and "median_ms" in r and row_unrolled(r) is not None})
    rule, rows, kept = forward.unrolled_bodies, [], None
    if args.missing and args.out.exists():
        kept = json.loads(args.out.read_text())
        rows = kept["programs"]
        done = {(r["method"], r["block_q"], r["block_kv"], r["block_kv_compute"],
                 tuple(sorted(program_unrolled(r)))) for r in rows}
        programs = [prog for prog in programs if prog not in done]
    shown = progress_bar(total=len(programs), desc=f"compiling for {args.chip}", unit="program")
    for method, bq, bkv, bkc, unrolled in programs:
        # the kernel built next unrolls exactly the bodies its measured row did
        forward.unrolled_bodies = lambda sizes, *_, kinds=frozenset(unrolled), **__: (
            kinds if forward.unroll_factor(sizes.slices) > 1 else frozenset())
        report = compile_for_tpu(get_preset("blog", block_q=bq, block_kv=bkv, block_kv_compute=bkc), method,
                                 args.chip, check_estimate=False)
        if not report.ok:
            print(f"code-sizes: {method} {bq}x{bkv}/{bkc} did not compile: {report.summary}", file=sys.stderr)
            return 1
        rows.append({"method": method, "block_q": bq, "block_kv": bkv, "block_kv_compute": bkc,
                     "unrolled_bodies": body_names(unrolled), "code_bytes": report.code_bytes,
                     **({"date": datetime.date.today().isoformat(), "git_commit": git_commit()} if kept else {})})
        shown.update(1)
    shown.close()
    forward.unrolled_bodies = rule
    record = kept or {"what": "bytes of code the TPU compiler generated for each forward program tools/tpu-measure.py "
                              "timed (memory_analysis().generated_code_size_in_bytes), compile-only for the chip, at "
                              "the case study's problem (75,600 tokens, 10 heads x 128, bf16), each with the kinds of "
                              "tile body its measured row unrolled; written by tools/code-sizes.py",
                      "evidence": "compile-only (the TPU compiler run on a CPU), not measured on a chip",
                      "chip": args.chip, "date": datetime.date.today().isoformat(), "jax": md.version("jax"),
                      "libtpu": md.version("libtpu"), "git_commit": git_commit()}
    record["programs"] = rows
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"code-sizes: {len(rows)} programs written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
