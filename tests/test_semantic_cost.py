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
