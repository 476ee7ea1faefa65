#!/usr/bin/env python3
"""Does one head keep both TensorCores of a megacore chip busy? The compiler's static profile of the B3
forward on a v5p (or v4), three grids, 1, 2 and 3 heads; writes svg_lib/data/megacore_split.json.

Forms (all the same kernel, `svg_lib.kernels.forward.block_sparse_attention`, its grid (heads, nq, steps)):
  default         ("parallel", "parallel", "arbitrary"): what the series runs
  heads_parallel  only the head axis "parallel"
  one_core        no "parallel" axis: one core runs every step (the reference)

The static profile reads scalar-prefetched tables as zeros (svg_lib.instruments.tpu.probes), which would
make every step idle; here the schedule's decoder (`grid.ScheduleRows.entry`) is replaced, for this
measurement only, by arithmetic on the step index that gives the B3 schedule of a band mask (checked
against the planner's schedule below), so every step runs the body the real schedule gives it. The
profile's cycles are a simulation of the compiled program, nothing run; compare them, do not turn them
into seconds. Profiling aborts where the parallel steps do not split evenly (an odd heads x nq: the core
split then divides by it, an instruction the profiler does not simulate), so nq is even here. The backward's
counterpart: tools/megacore-backward.py.

    PYTHONPATH=$PWD python tools/megacore-split.py [--target v5p] [--tokens 8192 16384 32768] [--out PATH]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK_Q, BLOCK_KV, HALF_WIDTH = 512, 256, 768  # band |q - k| <= 768: 8 key tiles per query tile
STEPS, STEP_SHIFT = 8, 3
FORMS = ("default", "heads_parallel", "one_core")
CYCLES = re.compile(r"estimated_cycles:\s*(\d+)")
NOTE = (
    "One number per kernel: the simulated cycles of one call, which halve where the grid's parallel steps"
    ' split between the two TensorCores. The profile cannot be trusted for scalar-prefetched table values'
    ' (the probes found zeros; here, with one head, the kind read was not 0), so the schedule decoder '
    "(grid.ScheduleRows.entry) was replaced, for this measurement only, by arithmetic giving the band's B3"
    " schedule (checked against the planner's); every step runs the body the real schedule gives it. "
    'Profiling aborts (an instruction the profiler does not simulate) where heads x nq is odd and all of '
    'it is parallel, so nq is a power of two here; such grids compile. Result (v5p, 8k-32k tokens): a '
    'megacore chip shares the steps of all parallel axes together, so the default grid runs at about half '
    'of one_core for 1, 2 and 3 heads: the forward needs no split of its own; only with the head axis alone '
    'parallel does one head leave a core idle (heads_parallel: 1 head = one_core, 3 heads = 2/3 of it). '
    'Written by tools/megacore-split.py.'
)


def band_b3_classes(tokens: int):
    """B3's tile classes of the band: a touched tile is FULL (tile-aligned, no key padding), else EMPTY."""
    import numpy as np

    from svg_lib.core.planner import EMPTY, FULL
    nq, nk = tokens // BLOCK_Q, tokens // BLOCK_KV
    q0 = np.arange(nq)[:, None] * BLOCK_Q
    k0 = np.arange(nk)[None, :] * BLOCK_KV
    # the nearest pair of tile (i, j): 0 apart where the ranges overlap
    gap = np.maximum(0, np.maximum(k0 - (q0 + BLOCK_Q - 1), q0 - (k0 + BLOCK_KV - 1)))
    return np.where(gap <= HALF_WIDTH, FULL, EMPTY).astype(np.int8)


def band_entry(nq: int, nk: int):
    """`schedule_entry(ref, n)` replaced by arithmetic for the band: entry n = i * STEPS + s of query
    tile i (one kind, so head_kind's zeros do not matter): its touched key tiles in order, then idle
    steps on the last one, as the planner lays them out."""
    import jax.numpy as jnp

    from svg_lib.core.planner import EMPTY, FULL
    lead = -(-HALF_WIDTH // BLOCK_KV)  # key tiles touched before a query tile's first: 3 at 768 / 256

    def entry(_ref, n):
        # n = (kind * nq + i) * STEPS + s; the kind, read from head_kind in SMEM, is dropped (nq a power
        # of two): the profile's SMEM reads are not to be trusted to be zeros (with one head they were not)
        i, s = (n >> STEP_SHIFT) & (nq - 1), n & (STEPS - 1)
        first = jnp.maximum(i * (BLOCK_Q // BLOCK_KV) - lead, 0)
        last = jnp.minimum(i * (BLOCK_Q // BLOCK_KV) + (BLOCK_Q // BLOCK_KV) - 1 + lead, nk - 1)
        count = last - first + 1
        return jnp.where(s < count, first + s, last), jnp.where(s < count, FULL, EMPTY)
    return entry


def check_entry(tokens: int) -> None:
    """The arithmetic schedule equals the planner's (schedule_rows of the band's B3 classes)."""
    import numpy as np

    from svg_lib.core.planner import schedule_rows
    classes = band_b3_classes(tokens)
    index, step_class, _ = schedule_rows(classes)
    if index.shape[1] != STEPS:
        raise SystemExit(f"the band's B3 schedule has {index.shape[1]} steps, not {STEPS}")
    entry = band_entry(*classes.shape)
    n = np.arange(index.size, dtype=np.int32)
    kv, cls = (np.asarray(x) for x in entry(None, n))
    assert (kv == index.ravel()).all() and (cls == step_class.ravel()).all(), "arithmetic schedule != planner's"


def measure(target: str, tokens: int, heads_list, profile_dir: str) -> list[dict]:
    from jax.experimental.pallas import tpu as pltpu

    import svg_lib.kernels.forward as fw
    from svg_lib.kernels import grid
    from svg_lib.instruments.tpu.compiler import compile_fn
    from svg_lib.methods import METHODS

    nq, nk = tokens // BLOCK_Q, tokens // BLOCK_KV
    entry = band_entry(nq, nk)  # the one decoder, grid.ScheduleRows.entry, reads entry row * steps + s
    grid.ScheduleRows.entry = lambda rows, ref, row, s: entry(ref, row * rows.steps + s)
    original_params = fw.compiler_params

    def params_for(form):
        """The kernel's `compiler_params` with the form's dimension semantics (the default's own)."""
        semantics = {"heads_parallel": ("parallel", "arbitrary", "arbitrary"), "one_core": ("arbitrary",) * 3}
        if form not in semantics:
            return original_params
        return lambda limit: pltpu.CompilerParams(dimension_semantics=semantics[form], vmem_limit_bytes=limit)

    rows = []
    for heads in heads_list:
        for form in FORMS:
            fw.compiler_params = params_for(form)

            def f(head_kind, schedule, q, k, v):
                return fw.block_sparse_attention(q, k, v, head_kind, schedule, steps=STEPS, method=METHODS["b3"],
                                                 keep=lambda qi, ki: ki < tokens, block_q=BLOCK_Q, block_kv=BLOCK_KV,
                                                 block_kv_compute=BLOCK_KV, interpret=False)
            for path in glob.glob(os.path.join(profile_dir, "*")):
                os.remove(path)
            start = time.perf_counter()
            shapes = [((heads,), "int32"), ((nq * STEPS // 2,), "int32")] + [((heads, tokens, 128), "bfloat16")] * 3
            compile_fn(f, shapes, target)
            found = [int(c) for p in glob.glob(os.path.join(profile_dir, "*block_sparse*_static_llo_profile.textproto"))
                     for c in CYCLES.findall(Path(p).read_text())]
            if len(found) != 1:
                raise SystemExit(f"expected one profile of the kernel, found {found}")
            rows.append({"heads": heads, "form": form, "cycles": found[0],
                         "compile_s": round(time.perf_counter() - start, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    fw.compiler_params = original_params
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="v5p", choices=("v5p", "v4"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768], help="512 x a power of two each")
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", default=str(REPO / "svg_lib" / "data" / "megacore_split.json"))
    args = parser.parse_args()
    for tokens in args.tokens:
        nq = tokens // BLOCK_Q
        if tokens % BLOCK_Q or nq < 8 or nq & (nq - 1):
            parser.error(f"--tokens must be {BLOCK_Q} times a power of two, at least {8 * BLOCK_Q}, got {tokens}")
    profile_dir = tempfile.mkdtemp(prefix="megacore_profile_")
    # libtpu reads its flags once, when it starts: set before jax (svg_lib imports it lazily)
    os.environ["LIBTPU_INIT_ARGS"] = " ".join([os.environ.get("LIBTPU_INIT_ARGS", ""),
                                               f"--xla_jf_dump_static_llo_profile_to={profile_dir}"]).strip()
    import svg_lib  # noqa: F401  (sets up libtpu sharing before jax starts)
    from svg_lib.instruments.tools.report import git_commit  # the commit measured, "+ local changes" if dirty
    from svg_lib.instruments.tpu.probes import versions
    rows = []
    for tokens in args.tokens:
        check_entry(tokens)
        rows += [{"tokens": tokens, **r} for r in measure(args.target, tokens, args.heads, profile_dir)]
    one = {(r["tokens"], r["heads"]): r["cycles"] for r in rows if r["form"] == "one_core"}
    for r in rows:
        r["vs_one_core"] = round(r["cycles"] / one[r["tokens"], r["heads"]], 3)
    data = {
        "what": "simulated cycles (libtpu static LLO profile, compile-only) of one call of the B3 forward kernel",
        "target": args.target, "block_q": BLOCK_Q, "block_kv": BLOCK_KV, "head_dim": 128,
        "dtype": "bfloat16", "mask": f"band |q - k| <= {HALF_WIDTH}, B3 (tile-aligned): {STEPS} steps per query tile",
        "forms": {"default": "grid (heads, nq, steps), parallel x parallel x arbitrary (the series' kernel)",
                  "heads_parallel": "grid (heads, nq, steps), only the head axis parallel",
                  "one_core": "no parallel axis: one TensorCore runs every step"},
        "note": NOTE,
        "versions": versions(), "commit": git_commit(), "rows": rows}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    for r in rows:
        print(f"{args.target} {r['tokens']:>6} tokens  heads {r['heads']}  {r['form']:15} {r['cycles']:>10,} cycles  "
              f"{r['vs_one_core']:.3f} of one core")


if __name__ == "__main__":
    main()
