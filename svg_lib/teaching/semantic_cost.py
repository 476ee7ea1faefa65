"""Reading the recorded cost of semantic tiles on a TPU: notebook 12's table and ratios.

The record is the JSON `notebooks/data/12_semantic_cost.py` writes (the notebook passes it in as a
dict): compile-only programs for a v6e priced by the TPU compiler's static profile (simulated
cycles, nothing ran). Its "summary" has a row per (tokens, heads, tiles) with per-head cycles of the
plan, the permutation (a row gather), the permutation's gradient and semantic tiles' attention, and
B3's attention at the case study's size; its "compiles" hold every program with its top ops.
"""
from __future__ import annotations

ONEHOT_SHARE = 4  # the one-hot permutation was compiled for one tensor of the four a step permutes


def rows(record: dict) -> list[dict]:
    """Per summary row: tokens, heads, tiles, per-head cycles of the plan, the permutation ("gather"),
    its gradient and the attention served, and `extra`: plan and permutation over that attention."""
    out = []
    for r in record["summary"]:
        row = dict(tokens=r["tokens"], heads=r["heads"], block_q=r["block_q"], block_kv=r["block_kv"],
                   plan=r["plan_cycles_per_head"], gather=r["gather_cycles_per_head"],
                   gather_grad=r["gather_grad_cycles_per_head"], attention=r["semantic_attention_cycles_per_head"])
        row["extra"] = (row["plan"] + row["gather"]) / row["attention"]
        out.append(row)
    return out


def table(record: dict) -> str:
    """The record's provenance, its per-head cycles as a table, and each row's `extra` in words."""
    p = record["problem"]
    lines = [f"{record['mode']}, {record['chip']}, libtpu {record['libtpu']}, jax {record['jax']}; "
             f"{p['iterations']} k-means iterations from a warm start, {p['density']:.0%} of key tiles",
             f"{'tokens':>7} {'heads':>5} {'tiles':>9} {'plan':>10} {'permutation':>12} {'its gradient':>12} "
             f"{'attention':>10}   cycles per head"]
    lines += [f"{r['tokens']:>7,} {r['heads']:>5} {r['block_q']:>5}x{r['block_kv']:<3} {r['plan']:>10,.0f} "
              f"{r['gather']:>12,.0f} {r['gather_grad']:>12,.0f} {r['attention']:>10,.0f}" for r in rows(record)]
    lines += [f"{r['heads']} head(s), {r['tokens']:,} tokens, {r['block_q']} x {r['block_kv']}: plan and permutation "
              f"cost {r['extra']:.1f}x the attention they serve" for r in rows(record)]
    return "\n".join(lines)


def plans(record: dict) -> list[dict]:
    """The compiled plans that were priced (a compile the profile could not price has no cycles)."""
    return [c for c in record["compiles"] if c["program"] == "plan" and c.get("cycles")]


def sort_share(compiled: dict) -> float:
    """The share of one compiled program's cycles spent in its sorts (from its top ops)."""
    sorts = sum(o["cycles"] * o["equivalent"] * o["runs"] for o in compiled["top_ops"] if o["op"].startswith("sort"))
    return sorts / compiled["cycles"]


def permutation_forms(record: dict, heads: int = 1, tokens: int = 16_384) -> dict:
    """{form: cycles} of one step's permutation at (heads, tokens), for each form compiled there:
    "gather" (rows gathered by the order), "onehot" (a one-hot matmul; its single tensor's cycles
    times `ONEHOT_SHARE`) and "sort" (the tokens sorted by their cluster)."""
    forms = {c["program"]: c["cycles"] * (ONEHOT_SHARE if c["program"] == "onehot" else 1)
             for c in record["compiles"]
             if c["program"] in ("gather", "onehot", "sort") and (c["heads"], c["tokens"]) == (heads, tokens)}
    if not forms:
        raise ValueError(f"no permutation was compiled at {heads} head(s) of {tokens:,} tokens; compiled at "
                         f"{sorted({(c['heads'], c['tokens']) for c in record['compiles']})}")
    return forms


def permutation_against_b3(record: dict) -> tuple[int, float, float]:
    """(tokens, B3's cycles per head at the case study's size, the permutation's cycles per head at
    the most tokens recorded): what no reuse of a plan can save, beside the attention it serves."""
    b3 = record["summary"][0]["b3_blog_cycles_per_head"]
    tokens = max(r["tokens"] for r in record["summary"])
    moved = next(r["gather_cycles_per_head"] for r in record["summary"] if r["tokens"] == tokens)
    return tokens, b3, moved
