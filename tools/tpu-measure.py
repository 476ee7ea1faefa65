#!/usr/bin/env python3
"""Time the series' kernels on a real TPU at the case study's problem; merge what it measured into
svg_lib/data/tpu_measurements.json (one file for every chip measured; rows keyed by chip and setting).

What it runs (each a part, `--parts`):
  forward    splash_dense, dense, b1, b2, b3 at each `--tiles` size, the key-slice loop unrolled as the
             kernels choose (`forward.unrolled_bodies`) and with other sets of bodies forced (`--unroll`),
             each call's output checked on sampled query rows against a float32 reference
  splash     Splash's dense attention at more block sizes (`--splash-tiles`): the best B0 we can find
  training   forward + backward (`jax.grad` of sum(out * dout) for q, k, v) of dense, b1, b2, b3 with
             the fused and the split backward, and of splash_dense and splash (`--train-tiles`)
  masks      what a content mask costs on the chip: semantic tiles' plan (k-means on the device) and the
             temporal-major permutation at the case study's size
Every row: the median, min and max of `--repeats` calls after a warm-up (wall clock, each call until its
result is ready), the times themselves, the tiles visited and the MXU floor of that work at the chip's
bf16 peak (`svg_lib.chips.TARGETS`): dense methods count the real tokens' 4 N^2 d FLOPs per head, the
block-sparse ones the visited tiles' 4 bq bkv d each. The file records the chip, date, jax, jaxlib, libtpu
and the commit. `--deadline-s` stops starting rows after that many seconds, so a run always writes.

    PYTHONPATH=$PWD python tools/tpu-measure.py [--parts forward splash training masks] [--out PATH]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata as md
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_OUT = REPO / "svg_lib" / "data" / "tpu_measurements.json"


def tiles_arg(text: str) -> list[tuple]:
    """'3328x1536x512,2048x1024' -> [(3328, 1536, 512), (2048, 1024, None)]."""
    out = []
    for part in text.split(","):
        nums = [int(x) for x in part.lower().split("x")]
        if len(nums) not in (2, 3):
            raise argparse.ArgumentTypeError(f"tile sizes are BQxBKV or BQxBKVxBKC, got {part!r}")
        out.append(tuple(nums) + ((None,) if len(nums) == 2 else ()))
    return out


def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def kernels_sha() -> str:
    """sha256 of the kernels' source (forward.py, backward.py), first 16 hex digits: what was measured,
    where a copy of the tree carries no (or a stale) git history."""
    import hashlib
    digest = hashlib.sha256()
    for name in ("forward.py", "backward.py"):
        digest.update((REPO / "svg_lib" / "kernels" / name).read_bytes())
    return digest.hexdigest()[:16]


class Recorder:
    """The file's rows, merged by key, written after every row (a run cut short keeps what it did)."""

    def __init__(self, path: Path, chip: str, device_kind: str, commit: str | None = None):
        from svg_lib.instruments.tools.report import git_commit

        self.path = path
        start = path if path.exists() else DEFAULT_OUT   # a new file starts from the committed record
        self.data = json.loads(start.read_text()) if start.exists() else {"rows": []}
        self.run = {"chip": chip, "device_kind": device_kind, "date": datetime.date.today().isoformat(),
                    "jax": version("jax"), "jaxlib": version("jaxlib"), "libtpu": version("libtpu"),
                    "git_commit": commit or git_commit(), "kernels_sha": kernels_sha()}
        if commit:   # what the copy's git said, beside the commit it holds
            self.run["git_commit_as_seen"] = git_commit()
        self.data["note"] = (
            "Wall-clock times on a real TPU, written by tools/tpu-measure.py: the median, min and max of "
            "`repeats` calls after a warm-up, each call until its result was ready. mxu_floor_ms is the work's "
            "time at the chip's bf16 peak (dense methods: 4 N^2 d per head over the real tokens; block-sparse: "
            "4 bq bkv d per visited tile); mxu_fraction = floor / median. max_error: the largest |out - "
            "reference| over the sampled query rows (float32 reference under the mask the method computes).")

    def add(self, row: dict):
        row = {**self.run, **row}
        # the loop compiled is part of the key: "chosen" under a new rule is another program, not a re-run
        key = {k: row.get(k) for k in ("chip", "part", "method", "block_q", "block_kv", "block_kv_compute",
                                       "unroll", "loop", "unrolled_bodies", "backward", "what")}
        self.data["rows"] = [r for r in self.data["rows"]
                             if {k: r.get(k) for k in key} != key] + [row]
        self.data["rows"].sort(key=lambda r: (r["chip"], r["part"], r.get("block_q") or 0, r.get("block_kv") or 0,
                                              str(r.get("method")), str(r.get("unroll")), str(r.get("backward"))))
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


def main(argv=None) -> int:
    # the forward is measured for what the cost model prices, training for every Pallas kernel
    from svg_lib.methods import MODEL_METHODS, SPLASH_FIRST_METHODS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["forward", "splash", "training", "masks"],
                   choices=["forward", "splash", "training", "masks"])
    p.add_argument("--tiles", type=tiles_arg, default=tiles_arg("3328x1536x512,2048x1024x512,1024x1024x512,512x512"))
    p.add_argument("--unroll", default="chosen,rolled,unrolled",
                   help="key-slice loop settings: 'chosen' (the kernels' rule, forward.unrolled_bodies), 'rolled' "
                        "(never unrolled), 'unrolled' (every body, up to MAX_UNROLLED_CHUNKS slices), 'bounded' (the "
                        "bounded-max bodies only), 'bounded-free' (the bounded mask-free body only)")
    p.add_argument("--methods", nargs="+", default=list(MODEL_METHODS))
    p.add_argument("--splash-tiles", type=tiles_arg,
                   default=tiles_arg("2048x2048x512,4096x1024x512,1024x2048x512,2048x1024x1024,1024x512x512"))
    p.add_argument("--train-tiles", type=tiles_arg, default=tiles_arg("2048x1024x512"))
    p.add_argument("--train-methods", nargs="+", default=list(SPLASH_FIRST_METHODS))
    p.add_argument("--train-forms", nargs="+", default=["fused", "split"], choices=["fused", "split"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--deadline-s", type=float, default=None)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="the record to write, every row merged in: an existing file is added to, a new one starts "
                        "from the committed record, so it can replace that record as it is")
    p.add_argument("--commit", default=None,
                   help="the commit measured, where this checkout's git does not know it (a copied working tree)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from svg_lib.attention import build_attention
    from svg_lib.chips import TARGETS, parse_tpu_generation
    from svg_lib.instruments.tools.bench import method_tiles, sample_query_rows, sampled_reference
    from svg_lib.instruments.tools.measured import BODIES, body_names, loop_name
    from svg_lib.kernels.grid import TileSizes
    from svg_lib.kernels import forward
    from svg_lib.methods import METHODS
    from svg_lib.problem import get_preset

    device = jax.devices()[0]
    if device.platform != "tpu":
        print(f"tpu-measure: needs a TPU (jax's first device is {device.platform}); nothing measured", file=sys.stderr)
        return 2
    chip = parse_tpu_generation(device.device_kind)
    peak = TARGETS[chip].bf16_tflops * 1e12
    rec = Recorder(args.out, chip, device.device_kind, commit=args.commit)
    start_all = time.perf_counter()
    config = get_preset("blog")
    mask = config.mask()
    n, heads, d = config.tokens, config.heads, config.head_dim
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, dout = (jax.random.normal(key, config.shape, jnp.bfloat16) for key in keys)
    refs = {}

    def out_of_time():
        if args.deadline_s is not None and time.perf_counter() - start_all > args.deadline_s:
            print(f"tpu-measure: deadline of {args.deadline_s:.0f} s reached; rows so far are written", flush=True)
            return True
        return False

    def timed(fn, *xs):
        jax.block_until_ready(fn(*xs))
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(*xs))
            times.append((time.perf_counter() - t) * 1e3)
        return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
                "times_ms": [round(t, 3) for t in times], "repeats": args.repeats}

    def floor_ms(method, bq, bkv, backward=False):
        record = METHODS[method]
        if record.dense:
            flops = 4 * n * n * d * heads
        else:
            tiles = method_tiles(get_preset("blog", block_q=bq, block_kv=bkv), method)["tiles_visited"]
            flops = tiles * 4 * bq * bkv * d * heads
        return flops * (3.5 if backward else 1.0) / peak * 1e3  # forward 2 matmuls a tile, fused backward 5

    rows_checked = sample_query_rows(n, 128, 3328)

    def error(method, bq, bkv, out):
        which = METHODS[method].computed_mask(mask, bq, bkv)
        key = (METHODS[method].computes, bq, bkv)
        if key not in refs:
            f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            refs[key] = jax.jit(lambda a, b, c: sampled_reference(a, b, c, which, rows_checked))(*f32)
        got = out[:, jnp.asarray(rows_checked)].astype(jnp.float32)
        return float(jnp.max(jnp.abs(got - refs[key])))

    chosen_rule = forward.unrolled_bodies
    forced = {"rolled": set(), "unrolled": set(forward.UNROLL_ORDER),
              "bounded": {(True, False), (True, True)}, "bounded-free": {(True, False)}}

    def set_unroll(setting):
        """Which bodies the kernels built next unroll: the rule's choice, or a forced set (slice limits kept)."""
        def rule(sizes, masked_kinds=1, mask_free=True):
            if setting not in forced or forward.unroll_factor(sizes.slices) == 1:
                return chosen_rule(sizes, masked_kinds, mask_free)
            return frozenset(forced[setting])
        forward.unrolled_bodies = rule

    def build(method, bq, bkv, bkc, backward=None):
        return build_attention(mask, method=method, heads=heads, tokens=n, head_dim=d, dtype=jnp.bfloat16,
                               block_q=bq, block_kv=bkv, block_kv_compute=bkc, backward=backward)

    def forward_row(part, method, bq, bkv, bkc, unroll):
        set_unroll(unroll)
        t = time.perf_counter()
        try:
            fn = jax.jit(build(method, bq, bkv, bkc)).lower(q, k, v).compile()
        except Exception as e:  # a size a method refuses (VMEM, Splash's blocks): recorded, not fatal
            print(f"  {method} {bq}x{bkv}/{bkc} unroll {unroll}: refused: {str(e).splitlines()[0][:200]}", flush=True)
            rec.add({"part": part, "method": method, "block_q": bq, "block_kv": bkv, "block_kv_compute": bkc,
                     "unroll": unroll, "refused": str(e).splitlines()[0][:300]})
            return
        compile_s = time.perf_counter() - t
        sizes = TileSizes(bq, bkv, bkc)
        unrolled = BODIES.get(method, frozenset()) & forward.unrolled_bodies(sizes, 1, METHODS[method].mask_free_body)
        row = timed(fn, q, k, v)
        err = error(method, bq, bkv, fn(q, k, v))
        floor = floor_ms(method, bq, bkv)
        tiles = method_tiles(get_preset("blog", block_q=bq, block_kv=bkv), method)
        row.update({"part": part, "method": method, "block_q": bq, "block_kv": bkv, "block_kv_compute": bkc,
                    "unroll": unroll, "loop": loop_name(method, sizes, unrolled),
                    **({"unroll_factor": forward.unroll_factor(sizes.slices)} if unrolled else {}),
                    "code_budget": forward.CODE_BUDGET,
                    "code_bytes_estimate": forward.code_bytes(sizes, unrolled, 1, METHODS[method].mask_free_body),
                    **({"unrolled_bodies": body_names(unrolled)} if loop_name(method, sizes, unrolled)
                       not in (None, "one slice") else {}),
                    "tiles_visited_per_head": tiles["tiles_visited"], "heads": heads, "tokens": n,
                    "mxu_floor_ms": round(floor, 3), "mxu_fraction": round(floor / row["median_ms"], 4),
                    "max_error": err, "error_rows": len(rows_checked), "compile_s": round(compile_s, 2)})
        rec.add(row)
        print(f"  {method:12s} {bq}x{bkv}/{bkc} unroll {unroll}: median {row['median_ms']:.2f} ms "
              f"(min {row['min_ms']:.2f}, max {row['max_ms']:.2f}), MXU {row['mxu_fraction']:.3f}, "
              f"error {err:.1e}, compile {compile_s:.1f} s", flush=True)

    from svg_lib.problem import default_block_kv_compute
    if "forward" in args.parts:
        print(f"forward on {device.device_kind}, {config}", flush=True)
        for bq, bkv, bkc in args.tiles:
            bkc = bkc or default_block_kv_compute(bq, bkv)
            for method in args.methods:
                ours = METHODS[method].family == "svg_lib"
                settings = args.unroll.split(",") if ours and bkv // bkc > 1 else ["chosen"]
                for unroll in settings:
                    if out_of_time():
                        return 0
                    forward_row("forward", method, bq, bkv, bkc, unroll)
    set_unroll("chosen")
    if "splash" in args.parts:
        print("Splash's block sizes", flush=True)
        for bq, bkv, bkc in args.splash_tiles:
            if out_of_time():
                return 0
            forward_row("splash", "splash_dense", bq, bkv, bkc or default_block_kv_compute(bq, bkv), "chosen")
    if "training" in args.parts:
        print("training: forward + backward", flush=True)
        for bq, bkv, bkc in args.train_tiles:
            bkc = bkc or default_block_kv_compute(bq, bkv)
            for method in args.train_methods:
                forms = args.train_forms if METHODS[method].family == "svg_lib" else (None,)
                for form in forms:
                    if out_of_time():
                        return 0
                    attend = build(method, bq, bkv, bkc, backward=form)
                    grad = jax.grad(lambda a, b, c, g: jnp.sum(attend(a, b, c).astype(jnp.float32)
                                                               * g.astype(jnp.float32)), argnums=(0, 1, 2))
                    t = time.perf_counter()
                    try:
                        fn = jax.jit(grad).lower(q, k, v, dout).compile()
                    except Exception as e:
                        print(f"  {method} {form}: refused: {str(e).splitlines()[0][:200]}", flush=True)
                        continue
                    row = timed(fn, q, k, v, dout)
                    row.update({"part": "training", "method": method, "backward": form, "block_q": bq,
                                "block_kv": bkv, "block_kv_compute": bkc, "tokens": n, "heads": heads,
                                "compile_s": round(time.perf_counter() - t, 2),
                                "mxu_floor_ms": round(floor_ms(method, bq, bkv, backward=True), 3)})
                    row["mxu_fraction"] = round(row["mxu_floor_ms"] / row["median_ms"], 4)
                    rec.add(row)
                    print(f"  {method:12s} {form or '':6s} {bq}x{bkv}/{bkc}: forward + backward median "
                          f"{row['median_ms']:.1f} ms (min {row['min_ms']:.1f})", flush=True)
    if "masks" in args.parts and not out_of_time():
        from svg_lib.layers import semantic
        from svg_lib.core.geometry import temporal_major_permutation
        print("content masks: the semantic plan and the permutation", flush=True)
        perm = jnp.asarray(temporal_major_permutation(config.geometry))
        permute = jax.jit(lambda a, b, c: (a[:, perm], b[:, perm], c[:, perm]))
        row = timed(permute, q, k, v)
        row.update({"part": "masks", "what": "temporal-major permutation of q, k, v (a gather)", "tokens": n,
                    "heads": heads})
        rec.add(row)
        print(f"  permutation: median {row['median_ms']:.2f} ms", flush=True)
        for bq, bkv in ((3328, 1536), (1024, 512)):
            if out_of_time():
                return 0
            try:
                plan = jax.jit(lambda a, b: semantic.semantic_plan(a, b, block_q=bq, block_kv=bkv,
                                                                      density=config.density,
                                                                      geometry=config.geometry))
                row = timed(plan, q, k)
            except Exception as e:
                print(f"  semantic plan {bq}x{bkv}: refused: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            row.update({"part": "masks", "what": "semantic tiles' plan (k-means on the device)", "block_q": bq,
                        "block_kv": bkv, "tokens": n, "heads": heads})
            rec.add(row)
            print(f"  semantic plan {bq}x{bkv}: median {row['median_ms']:.2f} ms", flush=True)
    print(f"tpu-measure: done in {time.perf_counter() - start_all:.0f} s; {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
