#!/usr/bin/env python3
"""Fused or split backward on a megacore chip? The compiler's static profile of `jax.grad` of the B3
attention on a v5p (or v4), the backward fused (one kernel, only its head axis "parallel") and split (a dq
kernel and a dk/dv kernel, heads and tiles "parallel"), 1, 2 and 3 heads; writes
svg_lib/data/megacore_backward.json.

The program is `jax.grad` of the B3 forward (`forward.block_sparse_attention` with its log-sum-exp)
wrapped by `backward.with_backward`, the form forced as `build_attention(backward=...)` forces it, with
the VMEM limits `memory.vmem.estimate_vmem` gives for the target. Only the backward kernels' profiles are
read (the forward is the same program in both forms).

The static profile reads scalar-prefetched tables as zeros (svg_lib.instruments.tpu.probes), which would
make every step idle; as tools/megacore-split.py does for the forward, the schedules' one decoder
(`grid.ScheduleRows.entry`) is replaced, for this measurement only, by arithmetic on the step index
giving the band's B3 schedules, the forward's (per query tile, its key tiles: the forward and the dq
kernel) and the transposed one (per key tile, its query tiles: the dk/dv and fused kernels), each
checked against the planner's. Every step then runs the body the real schedule gives it. The cycles
are a simulation of the compiled program, nothing run; compare them, do not turn them into seconds.

    PYTHONPATH=$PWD python tools/megacore-backward.py [--target v5p] [--tokens 8192 16384] [--out PATH]
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
BLOCK_Q, BLOCK_KV, HALF_WIDTH, HEAD_DIM = 512, 256, 768, 128  # band |q - k| <= 768
FORMS = ("fused", "split")
KERNELS = {"fused": ("_attention_fused_bwd",), "split": ("_attention_dq", "_attention_dkv")}
CYCLES = re.compile(r"estimated_cycles:\s*(\d+)")
SUFFIX = "_static_llo_profile.textproto"
NOTE = (
    "One number per form: the simulated cycles of one call of the backward's kernels (the fused kernel, or the"
    " dq kernel plus the dk/dv kernel), which halve where a kernel's parallel grid steps split between the two"
    " TensorCores. The profile reads scalar-prefetched tables as zeros, so the schedule decoders were replaced"
    ", for this measurement only, by shift arithmetic on the program ids giving the band's B3 schedules (check"
    "ed against the planner's; with integer division instead of shifts the simulator took the idle branch on m"
    "ost steps). Result (v5p, 8k and 16k tokens): split / fused = 0.70 at 1 head, 1.38 at 2, 1.05 at 3, 1.17-1"
    ".19 at 5. The fused kernel has only its head axis parallel, so an odd head leaves a core idle, but the sp"
    "lit kernels do 7 matmuls per tile against its 5: split wins at 1 head only (heads x 0.71 < ceil(heads / 2"
    ")); svg_lib.runtime.split_backward_is_faster. Written by tools/megacore-backward.py."
)


def band_classes(tokens: int):
    """B3's tile classes of the band: a touched tile is FULL (tile-aligned, no key padding), else EMPTY."""
    import numpy as np

    from svg_lib.core.planner import EMPTY, FULL
    q0 = np.arange(tokens // BLOCK_Q)[:, None] * BLOCK_Q
    k0 = np.arange(tokens // BLOCK_KV)[None, :] * BLOCK_KV
    gap = np.maximum(0, np.maximum(k0 - (q0 + BLOCK_Q - 1), q0 - (k0 + BLOCK_KV - 1)))
    return np.where(gap <= HALF_WIDTH, FULL, EMPTY).astype(np.int8)


def band_rows(rows: int, cols: int, row_block: int, col_block: int, steps: int):
    """`step_at(row, s) -> (tile, class)` of the band's schedule with `rows` tiles of `row_block`
    tokens each visiting the touched tiles of `cols` x `col_block` in order, then idle steps on the
    last, as `planner.schedule_rows` lays them out: arithmetic on the program ids, no table read."""
    import jax.numpy as jnp

    from svg_lib.core.planner import EMPTY, FULL
    shift = col_block.bit_length() - 1
    assert col_block == 1 << shift, "tile sizes are powers of two here"

    def step_at(row, s):
        # column tile c is touched by row r where c * cb <= r * rb + rb - 1 + W and c * cb + cb - 1 >= r * rb - W
        # shifts of non-negative numbers: the simulator follows them (with a division it took the idle
        # branch on most steps)
        first = jnp.maximum(row * row_block - HALF_WIDTH, 0) >> shift
        last = jnp.minimum((row * row_block + row_block - 1 + HALF_WIDTH) >> shift, cols - 1)
        count = last - first + 1
        return jnp.where(s < count, first + s, last), jnp.where(s < count, FULL, EMPTY)
    return step_at


def check_rows(classes, row_block, col_block) -> int:
    """The arithmetic schedule of `classes`' rows equals the planner's; returns its steps per row."""
    import numpy as np

    from svg_lib.core.planner import schedule_rows
    index, step_class, _ = schedule_rows(classes)
    rows, steps = index.shape
    step_at = band_rows(rows, classes.shape[1], row_block, col_block, steps)
    r, s = (x.astype(np.int32) for x in np.meshgrid(np.arange(rows), np.arange(steps), indexing="ij"))
    tile, cls = (np.asarray(x) for x in step_at(r, s))
    assert (tile == index).all() and (cls == step_class).all(), "arithmetic schedule != planner's"
    return steps


def measure(target: str, tokens: int, heads_list, profile_dir: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import svg_lib.kernels.backward as bw
    import svg_lib.kernels.forward as fw
    from svg_lib.kernels import grid
    from svg_lib.core.planner import KernelTables
    from svg_lib.instruments.tpu.compiler import compile_fn
    from svg_lib.memory.vmem import estimate_vmem
    from svg_lib.methods import METHODS

    classes = band_classes(tokens)
    nq, nk = classes.shape
    steps, steps_t = check_rows(classes, BLOCK_Q, BLOCK_KV), check_rows(classes.T, BLOCK_KV, BLOCK_Q)
    forward_at = band_rows(nq, nk, BLOCK_Q, BLOCK_KV, steps)
    transposed_at = band_rows(nk, nq, BLOCK_KV, BLOCK_Q, steps_t)
    # the one decoder (grid.ScheduleRows.entry) reads row r, step s of a table: the forward's and the dq
    # kernel's rows are query tiles (the forward's r = kind * nq + i, the kind zeros: one mask), the
    # transposed walk's key tiles; the tables' shapes tell them apart
    step_at = {(nq, steps): forward_at, (nk, steps_t): transposed_at}
    assert len(step_at) == 2, "the forward and transposed schedules must differ in shape here"
    grid.ScheduleRows.entry = lambda rows, _ref, row, s: step_at[rows.rows, rows.steps](row, s)
    # the tables themselves are only shapes here (their values are not read)
    tables = KernelTables((nq, nk), np.zeros(-(-nq * steps // 2), np.int32), steps,
                          np.zeros(-(-nk * steps_t // 2), np.int32), steps_t)
    keep = lambda qi, ki: ki < tokens  # noqa: E731  (B3's predicate: padding only)
    blocks = dict(block_q=BLOCK_Q, block_kv=BLOCK_KV, block_kv_compute=BLOCK_KV, interpret=False)
    limit = lambda which: estimate_vmem(f"b3:{which}", BLOCK_Q, BLOCK_KV, HEAD_DIM, jnp.bfloat16, BLOCK_KV,  # noqa: E731
                                        target, q_len=tokens).vmem_limit_bytes
    forward_limit = estimate_vmem("b3", BLOCK_Q, BLOCK_KV, HEAD_DIM, jnp.bfloat16, BLOCK_KV, target).vmem_limit_bytes
    limits = {"fused": (limit("fused"),), "split": (limit("dq"), limit("dkv"))}

    rows = []
    for heads in heads_list:
        head_kind = jnp.zeros((heads,), jnp.int32)
        schedule = jnp.asarray(tables.schedule)
        for form in FORMS:
            def forward(q, k, v, residuals):
                return fw.block_sparse_attention(q, k, v, head_kind, schedule, steps=steps, method=METHODS["b3"], keep=keep,
                                                 vmem_limit_bytes=forward_limit, residuals=residuals, **blocks)
            run = bw.with_backward(forward, tables, backward_limits=lambda form=form: (form, limits[form]),
                                   method=METHODS["b3"], keep=keep, **blocks)
            grad = jax.grad(lambda q, k, v: jnp.sum(run(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
            for path in glob.glob(os.path.join(profile_dir, "*")):
                os.remove(path)
            start = time.perf_counter()
            compile_fn(grad, [((heads, tokens, HEAD_DIM), "bfloat16")] * 3, target)
            kernels = {}
            for path in glob.glob(os.path.join(profile_dir, "*" + SUFFIX)):
                name = os.path.basename(path)[:-len(SUFFIX)]
                for kernel in KERNELS[form]:
                    if kernel in name:
                        kernels[kernel.strip("_")] = max(int(c) for c in CYCLES.findall(Path(path).read_text()))
            if len(kernels) != len(KERNELS[form]):
                raise SystemExit(f"{form}: expected profiles of {KERNELS[form]}, found {sorted(kernels)}")
            rows.append({"tokens": tokens, "heads": heads, "form": form, "cycles": sum(kernels.values()),
                         "kernels": kernels, "compile_s": round(time.perf_counter() - start, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="v5p", choices=("v5p", "v4"),
                        help="v4's static profile aborted in libtpu 0.0.42.1 (its DMA latency model)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384], help="multiples of 512")
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument("--out", default=str(REPO / "svg_lib" / "data" / "megacore_backward.json"))
    args = parser.parse_args()
    for tokens in args.tokens:
        if tokens % BLOCK_Q or tokens < 4 * BLOCK_Q:
            parser.error(f"--tokens must be a multiple of {BLOCK_Q}, at least {4 * BLOCK_Q}, got {tokens}")
    profile_dir = tempfile.mkdtemp(prefix="megacore_backward_")
    # libtpu reads its flags once, when it starts: set before jax (svg_lib imports it lazily)
    os.environ["LIBTPU_INIT_ARGS"] = " ".join([os.environ.get("LIBTPU_INIT_ARGS", ""),
                                               f"--xla_jf_dump_static_llo_profile_to={profile_dir}"]).strip()
    import svg_lib  # noqa: F401  (sets up libtpu sharing before jax starts)
    from svg_lib.instruments.tools.report import git_commit  # the commit measured, "+ local changes" if dirty
    from svg_lib.instruments.tpu.probes import versions
    rows = []
    for tokens in args.tokens:
        rows += measure(args.target, tokens, args.heads, profile_dir)
    fused = {(r["tokens"], r["heads"]): r["cycles"] for r in rows if r["form"] == "fused"}
    for r in rows:
        r["vs_fused"] = round(r["cycles"] / fused[r["tokens"], r["heads"]], 3)
    data = {
        "what": "simulated cycles (libtpu static LLO profile, compile-only) of the backward kernels of one jax.grad "
                "of the B3 attention",
        "target": args.target, "block_q": BLOCK_Q, "block_kv": BLOCK_KV, "block_kv_compute": BLOCK_KV,
        "head_dim": HEAD_DIM, "dtype": "bfloat16",
        "mask": f"band |q - k| <= {HALF_WIDTH}, B3 (tile-aligned)",
        "forms": {"fused": "attention_fused: grid (heads, nk, steps_t), only the head axis parallel",
                  "split": "attention_dq (grid (heads, nq, steps)) + attention_dkv (grid (heads, nk, steps_t)), "
                           "heads and tiles parallel; cycles the sum of the two kernels'"},
        "note": NOTE,
        "versions": versions(), "commit": git_commit(), "rows": rows}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    for r in rows:
        print(f"{args.target} {r['tokens']:>6} tokens  heads {r['heads']}  {r['form']:6} {r['cycles']:>12,} cycles  "
              f"{r['vs_fused']:.3f} of fused  {r['kernels']}")


if __name__ == "__main__":
    main()
