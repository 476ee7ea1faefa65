"""E7, two per-tile costs fitted on two stages: the case study's stages (`case_study_stages`),
`check_tile_cost_fit` and its hidden cases.

The tile counts come from the plans of the case study's mask (`MethodPlans.of`,
`step_kinds`), the latencies from `BLOG_V6E_MS`."""
from __future__ import annotations

import math

import numpy as np

from svg_lib.methods import MethodPlans
from svg_lib.problem import BLOG_V6E_MS, get_preset
from svg_lib.instruments.tpu.cost import step_kinds
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt, _learner_exception


def case_study_stages(preset: str = "blog") -> dict:
    """{stage: (full tiles, masked tiles, latency ms)} for the case study's B0 to B3.

    Tile counts per head from svg_lib's plans of the preset's mask (B3: of its tile-aligned
    mask; B0: Splash's dense grid at the same blocks, every tile mask-free); latencies: the case
    study's v6e measurements (`svg_lib.problem.BLOG_V6E_MS`), meaningful for the "blog" preset only.
    """
    p = get_preset(preset)
    plans = MethodPlans.of(p.mask(), p.block_q, p.block_kv)
    stages = {}
    for method, stage in (("splash_dense", "B0"), ("b1", "B1"), ("b2", "B2"), ("b3", "B3")):
        kinds = step_kinds(method, plans)
        masked = kinds.get("svg_masked", 0) + kinds.get("padding_masked", 0)
        # B0's block-mask steps (padded keys; every pair kept) count as full tiles: the fit has two prices
        stages[stage] = (kinds.get("free", 0) + kinds.get("blocks", 0), masked, BLOG_V6E_MS[method])
    return stages


def _solve_costs(x, y):
    """(a, b) with full * a + masked * b = latency for both stages, or None if the mixes are proportional."""
    (fx, mx, tx), (fy, my, ty) = x, y
    det = fx * my - fy * mx
    if det == 0:
        return None
    return (tx * my - ty * mx) / det, (fx * ty - fy * tx) / det


def _tile_cost_cases(seed: int) -> list[_Case]:
    s = case_study_stages("blog")
    named = [("the case study's B2 and B3", "B2", "B3"), ("B3 and B2 (the same two stages, the other order)", "B3", "B2"),
             ("B0 and B1: one stage has no masked tile, the other no full one", "B0", "B1"),
             ("B1 and B3", "B1", "B3")]
    cases = [_Case(f"{name}: {_stage_words(s[x])} and {_stage_words(s[y])}", dict(x=s[x], y=s[y]))
             for name, x, y in named]
    rng = np.random.default_rng(seed)
    while len(cases) < 12:
        a = float(rng.uniform(0.01, 1.0))
        b = a * float(rng.uniform(1.0, 4.0))
        counts = rng.integers(0, 2000, size=(2, 2))
        if counts[0, 0] * counts[1, 1] == counts[1, 0] * counts[0, 1]:
            continue
        x, y = ((int(f), int(m), f * a + m * b) for f, m in counts)
        cases.append(_Case(f"random stages, a = {a:.4g}, b = {b:.4g}: {_stage_words(x)} and {_stage_words(y)}",
                           dict(x=x, y=y)))
    same = (s["B2"][0] * 2, s["B2"][1] * 2, s["B2"][2] * 2)
    cases.append(_Case(f"two stages with the same mix of tiles: {_stage_words(s['B2'])} and {_stage_words(same)}",
                       dict(x=s["B2"], y=same, singular=True)))
    cases.append(_Case("a stage with no tile at all: (0, 0, 0.0) and " + _stage_words(s["B1"]),
                       dict(x=(0, 0, 0.0), y=s["B1"], singular=True)))
    return cases


def _stage_words(stage) -> str:
    full, masked, ms = stage
    return f"({full} full, {masked} masked, {ms:.6g} ms)"


def _as_costs(value):
    try:
        a, b = value
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        raise _Fail(f"returned {value!r}, expected a pair of numbers (a, b)",
                    "return a tuple (a, b): a full tile's cost, then a masked tile's") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise _Fail(f"returned ({a}, {b}): not finite numbers",
                    "a division by a determinant of 0 gives inf or nan: that case should raise ValueError instead")
    return a, b


def check_tile_cost_fit(fn, *, seed: int = 0) -> CheckResult:
    """E7: `fn(stage_x, stage_y) -> (a, b)`, each stage `(full_tiles, masked_tiles, latency)`.

    `a` is a full (mask-free) tile's cost and `b` a masked tile's, such that
    `full * a + masked * b = latency` holds for both stages. Where the two stages' tile mixes
    are proportional no unique answer exists, and `fn` must raise ValueError. Checked on the
    case study's stages (`case_study_stages`), in both orders, and on random stages.
    """
    def run(case):
        x, y = case.data["x"], case.data["y"]
        if case.data.get("singular"):
            return run_singular(x, y)
        want = _solve_costs(x, y)
        got = _as_costs(_call(fn, "fit_tile_costs", x, y))
        scale = max(abs(want[0]), abs(want[1]))
        if all(abs(g - w) <= 1e-6 * scale for g, w in zip(got, want)):
            return
        detail = f"fit_tile_costs{(x, y)}: expected (a, b) = ({want[0]:.6g}, {want[1]:.6g}), got ({got[0]:.6g}, {got[1]:.6g})"
        close = lambda u, v: all(abs(g - w) <= 1e-6 * scale for g, w in zip(u, v))
        model = [f * got[0] + m * got[1] for f, m, _ in (x, y)]
        if close(got, want[::-1]):
            hint = "you returned (b, a): a comes first, the cost of a full (mask-free) tile; b is a masked tile's"
        elif close(got, (want[0], want[1] - want[0])):
            hint = ("your b is b - a: you counted a masked tile as a full tile too. A tile is either full or masked: "
                    "latency = full * a + masked * b")
        elif abs(got[0] - got[1]) <= 1e-9 * max(scale, 1e-30):
            hint = ("one cost for every tile cannot tell a masked tile from a full one: two stages give two "
                    "equations, solve them for two unknowns")
        else:
            hint = (f"with your (a, b) the model gives {model[0]:.6g} ms for the first stage (measured {x[2]:.6g}) and "
                    f"{model[1]:.6g} ms for the second (measured {y[2]:.6g}): both must match; write the two "
                    "equations full * a + masked * b = latency and solve them (by substitution, Cramer's rule "
                    "or np.linalg.solve)")
        raise _Fail(detail, hint)

    def run_singular(x, y):
        try:
            got = fn(x, y)
        except ValueError:
            return
        except Exception as exc:
            raise _learner_exception("fit_tile_costs", exc, {
                "ZeroDivisionError": "the determinant full_x * masked_y - full_y * masked_x is 0 here: check it "
                                     "first and raise ValueError"}) from None
        raise _Fail(f"fit_tile_costs{(x, y)} returned {_fmt(got)}; expected a ValueError",
                    "these stages' tile counts are proportional, so many (a, b) fit both and the data cannot "
                    "choose: check the determinant full_x * masked_y - full_y * masked_x and raise ValueError "
                    "when it is 0 (np.linalg.solve does not always notice: rounding can leave it a tiny pivot)")

    return _finish("E7 fit_tile_costs", _tile_cost_cases(seed), run,
                   "the case study's stages in both orders, random stages, and two that cannot be fitted")
