"""svg_lib.teaching.semantic_cost: notebook 12's reading of the recorded plan costs (JSON only, nothing compiles)."""
import json
from pathlib import Path

import pytest

from svg_lib.teaching import semantic_cost

RECORD = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "12_semantic_cost.json"


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def test_rows_follow_the_summary_and_extra_is_plan_and_permutation_over_attention(record):
    rows = semantic_cost.rows(record)
    assert len(rows) == len(record["summary"]) > 0
    for row, raw in zip(rows, record["summary"]):
        assert row["plan"] == raw["plan_cycles_per_head"] and row["attention"] == raw["semantic_attention_cycles_per_head"]
        assert row["extra"] == pytest.approx((raw["plan_cycles_per_head"] + raw["gather_cycles_per_head"])
                                             / raw["semantic_attention_cycles_per_head"])
    text = semantic_cost.table(record)
    assert text.count("the attention they serve") == len(rows) and record["libtpu"] in text


def test_sort_share_and_permutation_forms(record):
    for plan in semantic_cost.plans(record):
        assert plan["program"] == "plan" and 0.0 < semantic_cost.sort_share(plan) < 1.0
    forms = semantic_cost.permutation_forms(record, heads=1, tokens=16384)
    onehot = next(c for c in record["compiles"] if c["program"] == "onehot")
    assert set(forms) == {"gather", "onehot", "sort"} and forms["onehot"] == 4 * onehot["cycles"]
    with pytest.raises(ValueError, match="no permutation was compiled at 3 head"):
        semantic_cost.permutation_forms(record, heads=3, tokens=16384)
    tokens, b3, moved = semantic_cost.permutation_against_b3(record)
    assert tokens == max(r["tokens"] for r in record["summary"]) and b3 > moved > 0


REUSE = RECORD.with_name("12_reuse_tables.json")


@pytest.fixture(scope="module")
def reuse():
    return json.loads(REUSE.read_text())


def test_reuse_by_age_reads_the_record_and_the_table_prints_every_kind_and_age(reuse):
    for tokens in (7680, 75600):
        by_kind = semantic_cost.reuse_by_age(reuse, tokens)
        raw = reuse["sizes"][str(tokens)]["age"]["by_kind_and_age"]
        assert set(by_kind) == set(raw) and sorted(by_kind["content"]) == reuse["ages"]
        assert by_kind["spatial"][16] == (raw["spatial"]["16"]["reused"], raw["spatial"]["16"]["fresh"])
        assert all(r == f for r, f in [cell[0] for cell in by_kind.values()])   # age 0: the reused plan is the fresh one
        text = semantic_cost.reuse_age_table(reuse, tokens)
        assert text.count("\n") == 1 + len(raw) and f"{raw['content']['16']['reused']:.2f} {raw['content']['16']['fresh']:.2f}" in text
    with pytest.raises(ValueError, match="no run at 1,234 tokens; it holds 75600, 7680"):
        semantic_cost.reuse_by_age(reuse, 1234)


def test_refresh_policies_amortize_the_plan_over_the_steps(reuse):
    rows = semantic_cost.refresh_policies(reuse)
    raw = reuse["sizes"]["7680"]["policies"]
    assert [r["policy"] for r in rows] == [p["policy"] for p in raw]
    steps = 40
    for r in rows:
        refreshes = sum(n for _, _, n in r["kinds"].values())
        for tokens, cycles in r["plan_cycles"].items():
            assert cycles == pytest.approx(reuse["plan_cycles_per_head"][str(tokens)] * refreshes / steps)
    every = next(r for r in rows if r["policy"] == "every 1")
    assert all(n == steps for _, _, n in every["kinds"].values())
    text = semantic_cost.refresh_table(reuse)
    assert text.count("\n") == len(rows) + 3 and "the attention they serve" in text
    assert len({len(line) for line in text.splitlines()[1:]}) == 1  # every column under its heading
    with pytest.raises(ValueError, match="no refresh-policy runs"):
        semantic_cost.refresh_policies({"sizes": {"75600": reuse["sizes"]["75600"]}})
