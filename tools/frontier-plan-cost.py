"""Price what the frontier's records add to the attention: the plans and the permutation, compile-only
for a v6e, by the TPU compiler's static profile (simulated cycles; nothing runs). Writes
svg_lib/data/semantic_plan_cost.json, which `python -m svg_lib frontier --json PATH` reads.

    python tools/frontier-plan-cost.py --tokens 16384 32768 65536 --tiles 512x256 1024x1536 3328x1536

Per token count (powers of two only: the static profile aborts on a sort whose length is not one,
libtpu 0.0.42.1) and tile size, one head each:

* "plan" and "gather": notebooks/data/12_semantic_cost.py's programs (semantic_plan with 2 warm
  k-means iterations and the selection at 20 % of key tiles; the row gathers of q, k, v into cluster
  order and of the output back), compiled by that script (its child process sums libtpu's
  estimated_cycles over every op, times the trip counts of the loops around it);
* "pooled": `layers.pooled.pooled_plan` (tile means of q and k, their scores, the top-k per query
  tile at 20 % of key tiles), compiled here the same way (the same op counting, imported from it).

The record starts from notebook 12's (`notebooks/data/12_semantic_cost.json`, copied in when the
record is missing) and keeps every compile it holds; a compile asked again replaces its entry.
Each compile takes 5 s to 2 min and up to 13 GB (the plan at 65,536 tokens): run them one at a time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "svg_lib" / "data" / "semantic_plan_cost.json"
NB12 = ROOT / "notebooks" / "data" / "12_semantic_cost.py"


def _nb12():
    spec = importlib.util.spec_from_file_location("semantic_cost_12", NB12)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pooled_child(block_q: int, block_kv: int, profile_dir: str) -> dict:
    """Compile pooled_plan for one head of SVG12_TOKENS tokens; its cycles as 12_semantic_cost's child sums them."""
    import glob
    import re

    import jax

    import svg_lib  # noqa: F401
    from svg_lib.instruments.tpu.compiler import compile_fn
    from svg_lib.layers.pooled import pooled_plan

    nb = _nb12()
    x = ((nb.HEADS, nb.TOKENS, nb.HEAD_DIM), "bfloat16")
    fn = jax.jit(lambda q, k: pooled_plan(q, k, block_q=block_q, block_kv=block_kv, density=nb.DENSITY).tiles)
    compiled, seconds = compile_fn(fn, [x, x], nb.TARGET)
    times, unknown = nb.op_multiplicity(compiled.as_text())
    total, count = 0, 0
    for path in glob.glob(os.path.join(profile_dir, "*_static_llo_profile.textproto")):
        for block in pathlib.Path(path).read_text().split("hlo_op_estimate")[1:]:
            op = re.search(r'hlo_op_name:\s*"([^"]+)"', block).group(1)
            cycles = int(re.search(r"estimated_cycles:\s*(\d+)", block).group(1))
            same = re.search(r"num_equivalent_hlos:\s*(\d+)", block)
            total += cycles * (int(same.group(1)) if same else 1) * times.get(op, 1)
            count += 1
    return dict(program="pooled", block_q=block_q, block_kv=block_kv, cycles=total, compile_s=round(seconds, 1),
                loops_without_trip_count=unknown, op_count=count)


def pooled(tokens: int, block_q: int, block_kv: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="frontier_pooled_") as tmp:
        env = dict(os.environ, SVG12_HEADS="1", SVG12_TOKENS=str(tokens))
        env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_static_llo_profile_to={tmp}").strip()
        out = os.path.join(tmp, "result.json")
        proc = subprocess.run([sys.executable, __file__, "--child", str(block_q), str(block_kv), tmp, out], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return dict(program="pooled", block_q=block_q, block_kv=block_kv, error=f"exit {proc.returncode}: {tail}")
        return json.loads(pathlib.Path(out).read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[16384, 32768, 65536])
    parser.add_argument("--tiles", nargs="+", default=["512x256", "1024x1536", "3328x1536"])
    parser.add_argument("--programs", nargs="+", default=["plan", "gather", "pooled"], choices=["plan", "gather", "pooled"])
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    if not OUT.exists():
        shutil.copy(ROOT / "notebooks" / "data" / "12_semantic_cost.json", OUT)
    for n in args.tokens:
        if n & (n - 1):
            raise SystemExit(f"--tokens: {n} is not a power of two; the static profile aborts on such sorts")
        env = dict(os.environ, SVG12_HEADS="1", SVG12_TOKENS=str(n), PYTHONPATH=str(ROOT))
        if "plan" in args.programs or "gather" in args.programs:
            cmd = [sys.executable, str(NB12), str(OUT), "--tiles", *(args.tiles if "plan" in args.programs else []),
                   "--forms", *(["gather"] if "gather" in args.programs else [])]
            subprocess.run(cmd, env=env, check=True, timeout=args.timeout * 4)
        if "pooled" in args.programs:
            record = json.loads(OUT.read_text())
            for t in args.tiles:
                bq, bk = (int(s) for s in t.split("x"))
                start = time.perf_counter()
                got = pooled(n, bq, bk, args.timeout)
                got.update(heads=1, tokens=n, date=time.strftime("%Y-%m-%d"))
                record["compiles"] = [c for c in record["compiles"] if (c["program"], c["block_q"], c["block_kv"],
                                      c.get("heads"), c.get("tokens")) != ("pooled", bq, bk, 1, n)] + [got]
                OUT.write_text(json.dumps(record, indent=1) + "\n")
                print(json.dumps({k: got.get(k) for k in ("program", "block_q", "block_kv", "tokens", "cycles", "error")}),
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, bq, bk, profile_dir, out = sys.argv
        pathlib.Path(out).write_text(json.dumps(pooled_child(int(bq), int(bk), profile_dir)))
        sys.exit(0)
    sys.exit(main())
