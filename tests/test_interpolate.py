"""The simulated cost at tile sizes nobody probed: an interpolation of the committed probes (svg_lib.instruments.tpu.interpolate)."""
import pytest

from svg_lib.instruments.tpu.cost import load_reference
from svg_lib.instruments.tpu.interpolate import EVIDENCE, extrapolated, fit_costs, interpolated_cost


def test_exact_where_probed():
    for (chip, bq, bkv), probe in load_reference()["groups"]["after"].items():
        assert interpolated_cost(chip, bq, bkv) == probe and probe.evidence != EVIDENCE


def test_the_fit_error_is_the_largest_miss_on_the_probed_sizes():
    probes = load_reference()["groups"]["after"]
    for chip in ("v5e", "v6e"):
        fit = fit_costs(chip)
        for (kernel, kind), (a, b) in fit.lines.items():
            misses = []
            for bq, bkv in fit.probed:
                cost = probes[(chip, bq, bkv)]
                table = cost.per_row if kind == "rows" else cost.per_step.get(kernel, {})
                y = table.get(kernel) if kind == "rows" else table.get(kind)
                if y is not None:
                    misses.append(abs((a + b * (bq if kind == "rows" else bq * bkv)) / y - 1))
            assert fit.fit_error[(kernel, kind)] == pytest.approx(max(misses))
    # two probed sizes on a v5e: each line goes through both; four on a v6e: a fit that misses a little
    assert fit_costs("v5e").max_error < 1e-9
    v6e = fit_costs("v6e")
    assert 0.01 < v6e.fit_error[("svg_lib", "free")] < 0.10 and 0.01 < v6e.fit_error[("svg_lib", "svg_masked")] < 0.10


def test_between_probes_the_cost_lies_between_them_and_says_what_it_is():
    cost = interpolated_cost("v6e", 2048, 1536)
    low, high = (load_reference()["groups"]["after"][("v6e", bq, 1536)] for bq in (1024, 3328))
    assert low.per_step["svg_lib"]["free"] < cost.per_step["svg_lib"]["free"] < high.per_step["svg_lib"]["free"]
    assert cost.evidence == EVIDENCE and "interpolated" in cost.evidence and "simulated" in cost.evidence
    assert not extrapolated("v6e", 2048, 1536) and extrapolated("v6e", 128, 128) and extrapolated("v6e", 8192, 2048)


def test_a_chip_without_two_probes_is_refused():
    with pytest.raises(ValueError, match="needs two or more"):
        fit_costs("v4")
