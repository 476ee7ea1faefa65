#!/usr/bin/env python3
"""Where a block-sparse forward's time goes beyond its tiles' matmuls, measured on a real TPU.

The library's B3 kernel (`kernels.forward.block_sparse_attention`) at the case study's problem (75,600
tokens, 10 heads x 128, bf16) and tiles (3328 x 1536 / 512), run over synthetic schedules: every query tile
visits the same N mask-free key tiles (0 ... N-1), then idles for S - N steps (class EMPTY, no DMA).

    fit        S = N for several N: time = tiles x (per tile) + query tiles x (per query tile), least squares
    idle       S > N: what an idle step costs, against the same N with S = N
    parts      at N = 2, S = 2, where the per-query-tile work weighs most, each part of it patched out:
               the state's zeroing (`init_state`), the bound's start (`start_bound`), its check
               (`check_bound`), the finish (`finish`), and all four at once. Patched kernels are not exact:
               each row prices a part, it is not a kernel to ship.
    blocks     at N = 2, S = 2: the query and output blocks held for a whole head (`grid.Schedule.q_map`
               patched to name query tile 0 at every step, so no q block is fetched and no output block
               written back when the query tile changes), alone and with the four parts out: what the
               pipeline's block changes cost a query tile. Wrong outputs, a price only.

Each row: median, min and max of `--repeats` calls after a warm-up. Rows go to `--out` (JSON), with the chip,
date and versions.

    PYTHONPATH=$PWD python tools/tpu-overheads.py --out overheads.json [--parts fit idle parts]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def synthetic_schedule(query_tiles: int, tiles: int, steps: int):
    """The packed schedule (`planner.pack_schedule`) of `query_tiles` rows that each visit key tiles 0 ...
    tiles - 1 mask-free (FULL), then idle (EMPTY) for `steps - tiles` steps on the last of them."""
    import numpy as np

    from svg_lib.core.planner import EMPTY, FULL, pack_schedule

    if not 1 <= tiles <= steps:
        raise ValueError(f"need 1 <= tiles <= steps, got tiles={tiles}, steps={steps}")
    kv = np.zeros((query_tiles, steps), np.int64)
    cls = np.full((query_tiles, steps), EMPTY, np.int64)
    kv[:, :tiles] = np.arange(tiles)
    kv[:, tiles:] = tiles - 1          # idle steps repeat the resident tile: no DMA
    cls[:, :tiles] = FULL
    return pack_schedule(kv, cls)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["fit", "idle", "parts", "blocks"],
                   choices=["fit", "idle", "parts", "blocks"])
    p.add_argument("--tiles", default="3328x1536x512")
    p.add_argument("--fit-n", default="1,2,6,12,22,44")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from svg_lib.attention import check_memory
    from svg_lib.chips import parse_tpu_generation
    from svg_lib.environment import installed_version
    from svg_lib.core.planner import plan_tiles
    from svg_lib.kernels import forward, grid
    from svg_lib.methods import METHODS
    from svg_lib.problem import get_preset

    device = jax.devices()[0]
    if device.platform != "tpu":
        print(f"tpu-overheads: needs a TPU (jax's first device is {device.platform}); nothing measured",
              file=sys.stderr)
        return 2
    bq, bkv, bkc = (int(x) for x in args.tiles.split("x"))
    config = get_preset("blog")
    n, heads, d = config.tokens, config.heads, config.head_dim
    nq, nk = -(-n // bq), -(-n // bkv)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, config.shape, jnp.bfloat16) for key in keys)
    q = (q.astype(jnp.float32) / np.sqrt(d)).astype(jnp.bfloat16)
    run = {"chip": parse_tpu_generation(device.device_kind),
           "device_kind": device.device_kind, "date": datetime.date.today().isoformat(),
           "jax": installed_version("jax"), "jaxlib": installed_version("jaxlib"), "libtpu": installed_version("libtpu"),
           "git_commit": args.commit, "block_q": bq, "block_kv": bkv, "block_kv_compute": bkc,
           "tokens": n, "heads": heads, "head_dim": d, "query_tiles": nq * heads}
    rows = []
    # the VMEM limit the library asks for at these tiles (attention.check_memory on the study's B3 plan)
    plan = plan_tiles(METHODS["b3"].computed_mask(config.mask(), bq, bkv), bq, bkv)
    limit = check_memory("b3", heads=heads, head_dim=d, dtype=config.dtype, block_q=bq, block_kv=bkv,
                         block_kv_compute=bkc, generation=None, plan=plan, tables=plan.tables, splash_mask=None,
                         q_len=None, backward=None).forward_limit

    originals = {name: getattr(forward, name) for name in ("init_state", "start_bound", "check_bound", "finish")}

    def no_init(m_ref, l_ref, acc_ref, flag_ref=None):
        if flag_ref is not None:
            flag_ref[0] = forward.UNDECIDED

    def no_start(q_ref, m_ref, key_norm_max):
        m_ref[...] = jnp.full(m_ref.shape, 20.0, jnp.float32)

    def no_check(m_ref, l_ref, acc_ref, flag_ref, **kw):
        flag_ref[0] = forward.BOUNDED

    def no_finish(m_ref, l_ref, acc_ref, o_ref, interpret=False, lse_ref=None):
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def one_block(self, h, i, s, **tables):   # every query tile reads and writes its head's first block
        return self.head(h, tables["head_order_ref"]), 0, 0

    patches = {"init_state": no_init, "start_bound": no_start, "check_bound": no_check, "finish": no_finish}
    original_q_map = grid.Schedule.q_map

    def timed(tiles_, steps, what, patched=()):
        for name, fn in originals.items():
            setattr(forward, name, patches[name] if name in patched else fn)
        grid.Schedule.q_map = one_block if "q_out_blocks" in patched else original_q_map
        table = jnp.asarray(synthetic_schedule(nq, tiles_, steps))
        head_kind = jnp.zeros((heads,), jnp.int32)

        def attend(a, b, c):
            return forward.block_sparse_attention(
                a, b, c, head_kind, table, steps=steps, method=METHODS["b3"], keep=lambda qi, ki: ki < n,
                block_q=bq, block_kv=bkv, block_kv_compute=bkc, interpret=False, vmem_limit_bytes=limit)
        t = time.perf_counter()
        try:   # the patches live only while the kernel is traced and compiled
            fn = jax.jit(attend).lower(q, k, v).compile()
        finally:
            for name, orig in originals.items():
                setattr(forward, name, orig)
            grid.Schedule.q_map = original_q_map
        compile_s = time.perf_counter() - t
        jax.block_until_ready(fn(q, k, v))
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            times.append((time.perf_counter() - t) * 1e3)
        row = {"what": what, "tiles_per_query_tile": tiles_, "steps": steps, "patched_out": list(patched),
               "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
               "times_ms": [round(x, 3) for x in times], "repeats": args.repeats,
               "tiles": tiles_ * nq * heads, "compile_s": round(compile_s, 2)}
        rows.append(row)
        print(f"  {what:10s} N={tiles_:3d} S={steps:3d} {'-'.join(patched) or 'shipped':40s} "
              f"median {row['median_ms']:8.3f} ms (min {row['min_ms']:.3f}, max {row['max_ms']:.3f})", flush=True)
        args.out.write_text(json.dumps({"run": run, "rows": rows}, indent=1) + "\n")
        return row

    print(f"tpu-overheads on {device.device_kind}: {n} tokens, {heads} heads x {d}, {bq}x{bkv}/{bkc}", flush=True)
    if "fit" in args.parts:
        fit = [timed(m, m, "fit") for m in (int(x) for x in args.fit_n.split(",")) if m < nk]
        a = np.array([[r["tiles"], nq * heads] for r in fit], float)
        y = np.array([r["median_ms"] for r in fit]) * 1e3
        (per_tile, per_query_tile), *_ = np.linalg.lstsq(a, y, rcond=None)
        resid = y - a @ np.array([per_tile, per_query_tile])
        run["fit"] = {"per_tile_us": round(float(per_tile), 3), "per_query_tile_us": round(float(per_query_tile), 3),
                      "largest_residual_us": round(float(np.abs(resid).max()), 1)}
        print(f"  fit: {per_tile:.3f} us a tile, {per_query_tile:.3f} us a query tile "
              f"(largest residual {np.abs(resid).max():.0f} us)", flush=True)
    if "idle" in args.parts:
        for m, steps in ((2, 22), (12, 22)):
            timed(m, steps, "idle")
    if "parts" in args.parts:
        for patched in ((), ("init_state",), ("start_bound",), ("check_bound",), ("finish",), tuple(patches)):
            timed(2, 2, "parts", patched)
    if "blocks" in args.parts:
        for patched in (("q_out_blocks",), (*patches, "q_out_blocks")):
            timed(2, 2, "blocks", patched)
    args.out.write_text(json.dumps({"run": run, "rows": rows}, indent=1) + "\n")
    print("tpu-overheads: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
