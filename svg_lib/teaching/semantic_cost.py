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


# Plans reused across denoising steps: the record `notebooks/data/12_reuse_tables.py` writes (recall
# measured on CPU on the denoising proxy; plan cycles from the static profile above, amortized).

def reuse_by_age(record: dict, tokens: int) -> dict:
    """{kind: {age: (reused recall, fresh recall)}} at `tokens` (a size the reuse record holds),
    each the mean over the record's anchor steps."""
    sizes = record["sizes"]
    if str(tokens) not in sizes:
        raise ValueError(f"the reuse record holds no run at {tokens:,} tokens; it holds {', '.join(sorted(sizes))}")
    table = sizes[str(tokens)]["age"]["by_kind_and_age"]
    return {kind: {int(age): (cell["reused"], cell["fresh"]) for age, cell in by_age.items()}
            for kind, by_age in table.items()}


def reuse_age_table(record: dict, tokens: int) -> str:
    """Recall of a plan reused `age` steps after it was made beside a plan made at that step
    ("reused fresh"), one row per head kind, with the size, tiles and anchor steps above."""
    by_kind = reuse_by_age(record, tokens)
    size = record["sizes"][str(tokens)]
    ages = sorted(next(iter(by_kind.values())))
    made = ("plans made at steps " if len(size["anchors"]) > 1 else "plan made at step ") + ", ".join(
        map(str, size["anchors"]))
    lines = [f"{size['geometry']}, {size['block_q']} x {size['block_kv']} tiles, {made}, fresh plans "
             f"{size['fresh']}; recall of the reused and the fresh plan by age",
             f"{'age':>9} " + " ".join(f"{a:>11}" for a in ages)]
    lines += [(f"{kind:>9} " + " ".join(f"{by_age[a][0]:>5.2f} {by_age[a][1]:<5.2f}" for a in ages)).rstrip()
              for kind, by_age in by_kind.items()]
    return "\n".join(lines)


def refresh_policies(record: dict) -> list[dict]:
    """Per refresh policy: its name and, per head kind, (mean recall over the steps, mean over the last
    10 steps, refreshes), and `plan_cycles`: {tokens: the four heads' amortized plan cycles per step}."""
    size = next((s for s in record["sizes"].values() if "policies" in s), None)
    if size is None:
        raise ValueError("the reuse record holds no refresh-policy runs (12_reuse_tables.py records them at 7,680 tokens)")
    kinds = [k for k in size["age"]["by_kind_and_age"]]
    out = []
    for p in size["policies"]:
        row = {"policy": p["policy"], "kinds": {k: (p[k]["mean_recall"], p[k]["last_10_steps_recall"],
                                                    p[k]["refreshes"]) for k in kinds}}
        row["plan_cycles"] = {int(t): sum(p[k]["plan_cycles_per_step"][t] for k in kinds)
                              for t in p[kinds[0]]["plan_cycles_per_step"]}
        out.append(row)
    return out


def refresh_table(record: dict) -> str:
    """The refresh policies: per head kind its mean recall, its recall over the last 10 steps and its
    refreshes, each under its own heading, and the four heads' amortized plan cycles per step (millions)
    at each recorded plan size."""
    rows = refresh_policies(record)
    kinds, sizes = list(rows[0]["kinds"]), sorted(rows[0]["plan_cycles"])
    kind_width = 17  # "mean last10 refreshes" under each kind: 4 + 1 + 6 + 1 + 5
    lines = [f"{record['schedule']}; recall of each kind of head over all steps (mean) and the last 10 (last10), "
             f"and its refreshes; plan: the {len(kinds)} heads' plan cycles per step, millions (simulated, v6e static "
             f"profile), at this many tokens",
             f"{'':>33} " + "  ".join(f"{k:^{kind_width}}" for k in kinds) + " " + " ".join(f"{'plan':>7}" for _ in sizes),
             f"{'policy':>33} " + "  ".join(f"{'mean':>4} {'last10':>6} {'refr.':>5}" for _ in kinds) + " "
             + " ".join(f"{t:>7,}" for t in sizes)]
    for r in rows:
        lines.append(f"{r['policy']:>33} " + "  ".join(f"{m:>4.2f} {l:>6.2f} {n:>5}" for m, l, n in r["kinds"].values())
                     + " " + " ".join(f"{r['plan_cycles'][t] / 1e6:>7.2f}" for t in sizes))
    attention = record["semantic_attention_cycles_per_head"]
    lines.append(f"{'the attention they serve':>33} " + " " * ((kind_width + 2) * len(kinds) - 2) + " "
                 + " ".join(f"{len(kinds) * attention[str(t)] / 1e6:>7.2f}" for t in sizes))
    return "\n".join(lines)
