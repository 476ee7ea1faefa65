"""What semantic tiles cost beside the attention, at the case study's size on a TPU v6e: compile-only,
priced by the TPU compiler's static profile (simulated cycles; nothing ran). Notebook 12 reads the JSON.

    SVG12_HEADS=8 SVG12_TOKENS=16384 python notebooks/data/12_semantic_cost.py \
        notebooks/data/12_semantic_cost.json [--forms gather ...] [--tiles 512x256 ...]

Programs compiled (SVG12_HEADS heads, default 10, x SVG12_TOKENS tokens, default the case study's
75,600, x head_dim 128, bf16, one v6e chip, topology v6e:1x1):

* "plan": `semantic_plan` with 2 iterations of tile-sized k-means from a warm start (the previous
  step's centroids), for q and k, and the tile selection, at each tile size asked;
* the permutation of q, k and v into cluster order and of the output back, in four forms:
  "gather" (`semantic.into_cluster_order` and `out_of_cluster_order`: row gathers head by head, k
  and v as one row twice as wide, the output back by the plan's inverse order), "gather_grad" (their
  transpose, what a training step adds: gathers by the inverse orders), "onehot" (a one-hot matrix
  times x on the MXU) and "sort" (a sort keyed by each token's place). The one-hot form needs a
  tokens x tokens matrix per head (11 GiB in bf16 at 75,600): it is compiled for one head and one
  tensor, so its record's cycles are a quarter of one head's permutation. The summary prices the
  permutation by the gather form.

Each compile runs in a child process with libtpu's static-profile dump on: libtpu writes one
`estimated_cycles` per HLO op it emits (every fusion, copy, sort, Mosaic kernel). A program's
cycles are their sum, each op weighted by how often it runs: the trip counts of the while loops
around it, read from the compiled HLO (`known_trip_count`). Ops run one after another on the
TensorCore here (no overlap is assumed), so the sum is what the static profile says the program
takes. B3's attention is priced the way the series prices it (`tpu.cost.model_cycles` on the
committed probes, `svg_lib/data`): the blog's mask at 3328 x 1536, and semantic tiles' own
attention at the tile size asked, every query tile visiting the same number of key tiles.

Status (2026-12-04, libtpu 0.0.42.1, this 2-core 24 GiB machine): at 512 x 256 tiles, the plan
and the gather forms compile for 1 and 8 heads of 16,384 tokens (the plan in 21 s and 29 s, at most
1.3 GB resident) and for 1 head of 65,536 (the plan in about 110 s and 12.9 GB: run it alone), and
the plan at 3328 x 1536 for 65,536: what the committed JSON holds. The case study's size stays out:
the static profile aborts on a sort whose length is not a power of two (49,152 and 75,600; 32,768
and 65,536 are priced). The sort and one-hot forms were compiled for one head of 16,384 tokens:
4.41 M cycles, and 4 x 0.33 M, against the gather's 0.20 M (the sort sorts every one of the 128
lanes as its own row; the one-hot form grows with tokens x tokens).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

# SVG12_HEADS=1: one head (heads run one after another: cycles scale by the heads), for a machine
# whose memory the 10-head compiles exceed
# SVG12_TOKENS: another token count (the static profile aborts on a sort whose length is not a power
# of two, 49,152 and 75,600 included, libtpu 0.0.42.1; 32,768 and 65,536 are priced)
HEADS, TOKENS, HEAD_DIM = int(os.environ.get("SVG12_HEADS", 10)), int(os.environ.get("SVG12_TOKENS", 75_600)), 128
ITERATIONS = 2
DENSITY = 0.2            # semantic tiles' share of key tiles per query tile (the recall tables' 20 %)
TARGET = "v6e"
FORMS = ("gather", "gather_grad", "onehot", "sort")


# -- the programs ------------------------------------------------------------------------------

def program(name: str, block_q: int, block_kv: int):
    """(function, [(shape, dtype), ...]) of one program to compile."""
    import jax
    import jax.numpy as jnp

    from svg_lib.layers.semantic import (SemanticCentroids, SemanticPlan, into_cluster_order, out_of_cluster_order,
                                         semantic_plan)

    nq, nk = (-(-TOKENS // block_q), -(-TOKENS // block_kv)) if block_q else (0, 0)
    x = ((HEADS, TOKENS, HEAD_DIM), "bfloat16")
    order = ((HEADS, TOKENS), "int32")
    if name == "plan":
        def plan(q, k, cq, ck):
            p = semantic_plan(q, k, block_q=block_q, block_kv=block_kv, density=DENSITY, iterations=ITERATIONS,
                              centroids=SemanticCentroids(cq, ck))
            return p.q_order, p.k_order, p.q_place, p.k_place, p.tiles, p.centroids.q, p.centroids.k
        return plan, [x, x, ((HEADS, nq, HEAD_DIM), "float32"), ((HEADS, nk, HEAD_DIM), "float32")]
    def orders(qo, ko, qp, kp):  # what the permutation reads of a plan
        return SemanticPlan(qo, ko, qp, kp, None, None, block_q, block_kv, 1)

    if name == "gather":  # q, k, v into cluster order and the output back: semantic_attention's gathers
        def gather(q, k, v, o, *order_and_place):
            plan = orders(*order_and_place)
            return into_cluster_order(q, k, v, plan) + (out_of_cluster_order(o, plan),)
        return gather, [x, x, x, x] + [order] * 4
    if name == "gather_grad":  # their transpose, for a training step: the gradients go back by gathers too
        def gather_grad(q, k, v, o, dq, dk, dv, do, *order_and_place):
            plan = orders(*order_and_place)
            _, back = jax.vjp(lambda q, k, v, o: into_cluster_order(q, k, v, plan) + (out_of_cluster_order(o, plan),),
                              q, k, v, o)
            return back((dq, dk, dv, do))
        return gather_grad, [x] * 8 + [order] * 4
    if name == "sort":  # each row sorted to its place: key = the place a token goes to
        def sort(q, k, v, o, qo, ko, qp, kp):
            outs = []
            for t, place in ((q, qp), (k, kp), (v, kp)):
                outs.append(jax.lax.sort((jnp.broadcast_to(place[..., None], t.shape), t), dimension=1, num_keys=1)[1])
            back = jnp.broadcast_to(qo[..., None], o.shape)  # the output: sorted back by original index
            outs.append(jax.lax.sort((back, o), dimension=1, num_keys=1)[1])
            return tuple(outs)
        return sort, [x, x, x, x] + [order] * 4
    if name == "onehot":  # one head, one tensor: P @ x with P[i, j] = (order[i] == j)
        def onehot(t, od):
            p = (od[:, None] == jnp.arange(TOKENS, dtype=jnp.int32)[None, :]).astype(jnp.bfloat16)
            return jnp.dot(p, t, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        return onehot, [((TOKENS, HEAD_DIM), "bfloat16"), ((TOKENS,), "int32")]
    raise ValueError(name)


# -- the child: compile with the profile dump on, sum the ops by how often they run -----------

_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_WHILE = re.compile(r"while\(.*condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CALLS = re.compile(r"(?:to_apply|calls|branch_computations)=\{?%?([\w.\-]+)")


_OPNAME = re.compile(r'op_name="([^"]+)"')


def inferred_trips(line: str) -> int:
    """A while loop's trip count when the compiler recorded none, from the jax code it came from
    (its op_name, whose last scope names the loop): the heads, the k-means iterations, the
    assignment's rounds of proposals, its halvings of a threshold, or a binary search
    (`jnp.searchsorted`'s scan, ceil(log2(n + 1)) steps; n = tokens, an upper bound for the searches
    over clusters)."""
    import math

    from svg_lib.layers.semantic_clusters import DEFAULT_HALVINGS, DEFAULT_ROUNDS

    name = _OPNAME.search(line)
    name = name.group(1) if name else ""
    bare = re.sub(r"[\w-]+\(|\)", "", name)  # transpose(jvp(heads))/while -> heads/while
    if "searchsorted" in name:
        return math.ceil(math.log2(TOKENS + 1))
    scopes = {"halvings/while": DEFAULT_HALVINGS, "rounds/while": DEFAULT_ROUNDS, "iterations/while": ITERATIONS,
              "heads/while": HEADS}  # the named scopes semantic_plan's loops run in
    for scope, trips in scopes.items():
        if bare.endswith(scope):
            return trips
    raise ValueError(f"a while loop of unknown trip count: {name or line[:200]}")


def op_multiplicity(hlo: str) -> tuple[dict, list]:
    """{instruction name: how many times it runs} from the compiled HLO's while loops, and the
    loops whose trip count the compiler did not record."""
    where, parent_of, unknown = {}, {}, []
    comp = None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith((" ", "\t")):  # a computation's header (instructions are indented)
            comp = m.group(1)
            continue
        m = _INSTR.match(line)
        if m and comp:
            where[m.group(1)] = comp
            w = _WHILE.search(line)
            if w:
                trip = _TRIP.search(line)
                n = int(trip.group(1)) if trip else inferred_trips(line)
                if not trip:
                    unknown.append(f"{m.group(1)}: {n} ({_OPNAME.search(line).group(1) if _OPNAME.search(line) else '?'})")
                parent_of[w.group(2)] = (comp, n)
                parent_of[w.group(1)] = (comp, n + 1)
            elif " call(" in line or "conditional(" in line:
                for c in _CALLS.findall(line):
                    parent_of.setdefault(c, (comp, 1))

    def times(c, seen=()):
        if c not in parent_of or c in seen:
            return 1
        up, n = parent_of[c]
        return n * times(up, seen + (c,))
    return {name: times(c) for name, c in where.items()}, unknown


def child(name: str, block_q: int, block_kv: int, profile_dir: str) -> dict:
    import jax

    import svg_lib  # noqa: F401  (sets up libtpu sharing)
    from svg_lib.instruments.tpu.compiler import compile_fn

    fn, shapes = program(name, block_q, block_kv)
    compiled, seconds = compile_fn(jax.jit(fn), shapes, TARGET)
    times, unknown = op_multiplicity(compiled.as_text())
    ops = []
    for path in glob.glob(os.path.join(profile_dir, "*_static_llo_profile.textproto")):
        text = pathlib.Path(path).read_text()
        for block in text.split("hlo_op_estimate")[1:]:
            op = re.search(r'hlo_op_name:\s*"([^"]+)"', block).group(1)
            cycles = int(re.search(r"estimated_cycles:\s*(\d+)", block).group(1))
            same = re.search(r"num_equivalent_hlos:\s*(\d+)", block)
            ops.append(dict(op=op, cycles=cycles, equivalent=int(same.group(1)) if same else 1,
                            runs=times.get(op, 1), found=op in times))
    memory = compiled.memory_analysis()
    total = sum(o["cycles"] * o["equivalent"] * o["runs"] for o in ops)
    ops.sort(key=lambda o: -o["cycles"] * o["equivalent"] * o["runs"])
    return dict(program=name, block_q=block_q, block_kv=block_kv, cycles=total, compile_s=round(seconds, 1),
                temp_bytes=int(memory.temp_size_in_bytes), loops_without_trip_count=unknown,
                ops_not_in_hlo=[o["op"] for o in ops if not o["found"]], top_ops=ops[:8], op_count=len(ops))


def run_child(name: str, block_q: int, block_kv: int, timeout: float) -> dict:
    """Compile one program in a subprocess with the static-profile dump on."""
    with tempfile.TemporaryDirectory(prefix="svg12_") as tmp:
        env = dict(os.environ)
        env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_static_llo_profile_to={tmp}").strip()
        out = os.path.join(tmp, "result.json")
        proc = subprocess.run([sys.executable, __file__, "--child", name, str(block_q), str(block_kv), tmp, out],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            why = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit {proc.returncode}"
            return dict(program=name, block_q=block_q, block_kv=block_kv, error=f"{why}: {tail}")
        return json.loads(pathlib.Path(out).read_text())


# -- the attention it sits beside ----------------------------------------------------------------

def attention_cycles(block_q: int, block_kv: int, tokens: int) -> dict:
    """Simulated cycles per head (cost model on the committed probes): B3 on the blog's mask at the
    blog's tiles, and semantic tiles' attention over `tokens` at `block_q` x `block_kv` (every query
    tile visiting round(DENSITY * nk) key tiles, the plan's budget), if that tile size was probed."""
    import numpy as np

    from svg_lib.core.masks import TileAlignedMask
    from svg_lib.core.planner import plan_tiles
    from svg_lib.methods import MethodPlans
    from svg_lib.layers.semantic import tile_budget
    from svg_lib.problem import get_preset
    from svg_lib.instruments.tpu.cost import cost_model, load_reference, model_cycles

    blog = get_preset("blog")
    after = load_reference()["groups"]["after"]
    b3 = cost_model(blog, after[TARGET, blog.block_q, blog.block_kv], methods=("b3",))["b3"]
    out = {"b3_blog": b3 / blog.heads}  # the model's heads run one after another
    if (TARGET, block_q, block_kv) in after:
        nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
        kept = np.zeros((nq, nk), bool)
        kept[:, :tile_budget(DENSITY, nk)] = True  # which key tiles does not change the count
        plan = plan_tiles(TileAlignedMask(tokens, block_q, block_kv, kept), block_q, block_kv)
        out["semantic_attention"] = model_cycles("b3", after[TARGET, block_q, block_kv], MethodPlans(tile_aligned=plan))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--tiles", nargs="*", default=["512x256"],
                        help="block_q x block_kv of the plans (none given: the permutation forms only)")
    parser.add_argument("--forms", nargs="*", default=list(FORMS), choices=FORMS)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per compile")
    args = parser.parse_args(argv)

    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    records = {_key(r): r for r in old.get("compiles", [])}
    todo = [(form, 0, 0) for form in args.forms]
    todo += [("plan",) + tuple(int(s) for s in t.split("x")) for t in args.tiles]
    for name, bq, bk in todo:
        start = time.perf_counter()
        record = run_child(name, bq, bk, args.timeout)
        record.update(heads=HEADS, tokens=TOKENS, date=datetime.date.today().isoformat())
        records[_key(record)] = record
        print(json.dumps({key: record.get(key) for key in
                          ("program", "block_q", "block_kv", "heads", "tokens", "cycles", "compile_s", "error")}),
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        write(args.out, records)  # after every compile: a long run that is stopped keeps what it got
    return 0


def _key(record: dict) -> tuple:
    """A compile's identity: the program, its tiles, and the heads and tokens it was compiled for."""
    return (record["program"], record["block_q"], record["block_kv"], record.get("heads", 1),
            record.get("tokens", 75_600))


def write(out: pathlib.Path, records: dict):
    """The JSON notebook 12 reads: every compile, and per plan compiled, its cycles per head beside the
    permutation's (gather form, same tokens), semantic tiles' own attention and B3's at the blog's size."""
    import jax

    from svg_lib.environment import libtpu_version

    summary = []
    for (name, bq, bk, heads, tokens), rec in sorted(records.items()):
        if name != "plan" or rec.get("cycles") is None:
            continue
        att = attention_cycles(bq, bk, tokens)

        def per_head(form):  # the permutation form's cycles per head at these tokens, the same heads first
            found = sorted((r for (n, _, _, h, t), r in records.items()
                            if n == form and t == tokens and r.get("cycles")), key=lambda r: r["heads"] != heads)
            return found[0]["cycles"] / found[0]["heads"] if found else None

        row = dict(block_q=bq, block_kv=bk, heads=heads, tokens=tokens, plan_cycles_per_head=rec["cycles"] / heads,
                   gather_cycles_per_head=per_head("gather"), gather_grad_cycles_per_head=per_head("gather_grad"),
                   semantic_attention_cycles_per_head=att.get("semantic_attention"),
                   b3_blog_cycles_per_head=att["b3_blog"])
        row["plan_vs_b3_blog"] = row["plan_cycles_per_head"] / att["b3_blog"]
        summary.append(row)
    out.write_text(json.dumps({
        "what": "semantic tiles' overhead: semantic_plan (tile-sized k-means of q and k, "
                f"{ITERATIONS} iterations from a warm start, tile selection at {DENSITY:.0%} of key tiles) and the "
                "permutation of q, k, v into cluster order and of the output back, against the attention",
        "mode": "compile-only static profile (simulated)", "chip": TARGET, "topology": "v6e:1x1",
        "problem": dict(head_dim=HEAD_DIM, dtype="bfloat16", density=DENSITY, iterations=ITERATIONS),
        "jax": jax.__version__, "libtpu": libtpu_version(),
        "machine": "2-core CPU, 24 GiB",
        "cycles_rule": "sum of estimated_cycles over every op libtpu emits, times its while loops' trip counts "
                       "(the compiler's known_trip_count, else inferred from the jax source: k-means iterations, "
                       "rounds of proposals, binary searches of ceil(log2(tokens + 1)) steps, an upper bound); "
                       "ops in sequence, no overlap",
        "summary": summary,
        "attention_note": "B3 on the blog's mask (75,600 tokens, 3328 x 1536) and semantic tiles' attention at the "
                          "plan's tokens, tiles and budget: tpu.cost.model_cycles on the committed probes "
                          "(svg_lib/data), per head, all steps mask-free",
        "compiles": list(records.values()),
        "command": "SVG12_HEADS=h SVG12_TOKENS=n python notebooks/data/12_semantic_cost.py "
                   "notebooks/data/12_semantic_cost.json [--forms ...] [--tiles ...]",
    }, indent=1) + "\n")
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, name, bq, bk, profile_dir, out = sys.argv
        pathlib.Path(out).write_text(json.dumps(child(name, int(bq), int(bk), profile_dir)))
        sys.exit(0)
    sys.exit(main())
