"""A tile body's simulated cost at tile sizes nobody probed: an interpolation of the committed probes.

The committed reference (`cost.load_reference()`, group "after") holds the static profile's cycles
per grid step of each body kind at a few tile sizes per chip (v6e: 512 x 256, 1024 x 1536,
3328 x 1536, 4864 x 1536; v5e: 512 x 256, 3328 x 1536). `interpolated_cost(chip, block_q,
block_kv)` returns the probed `TileCost` itself where these tiles were probed, and elsewhere one
whose every body kind is `a + b * block_q * block_kv` cycles per step (and each query tile's
per-row cost `a + b * block_q`), fitted per chip and kind to the probed sizes by least squares on
relative error. It is an interpolation of simulated figures, not a probe: `fit_error` gives the
largest relative miss of the fit on the probed sizes (zero with two probes, a line through them);
sizes beyond the probed range are extrapolations (`extrapolated`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svg_lib.problem import default_block_kv_compute
from svg_lib.instruments.tpu.cost import TileCost, load_reference

EVIDENCE = ("interpolated across the probed tile sizes from the TPU compiler's static LLO profile "
            "(simulated, compile-only; not measured, not probed at these tiles)")


@dataclass(frozen=True)
class CostFit:
    """One chip's fit: for each (kernel, kind) the line `a + b * x` (x: pairs per tile, or block_q for
    "rows") and its largest relative miss on the probed sizes."""

    chip: str
    lines: dict          # (kernel, kind) -> (a, b)
    fit_error: dict      # (kernel, kind) -> max |fit / probe - 1| on the probed sizes
    probed: tuple        # ((block_q, block_kv), ...) the sizes fitted

    @property
    def max_error(self) -> float:
        return max(self.fit_error.values(), default=0.0)


def _line(xs, ys) -> tuple[float, float]:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if np.ptp(xs) == 0:     # one size (or one x): a constant
        return float(ys.mean()), 0.0
    w = 1.0 / ys            # least squares on relative error
    a, b = np.linalg.lstsq(np.stack([w, w * xs], axis=1), np.ones_like(ys), rcond=None)[0]
    return float(a), float(b)


def fit_costs(chip: str, group: str = "after") -> CostFit:
    """Fit every (kernel, body kind) probed at two or more tile sizes on `chip` (see the module docstring)."""
    probes = {(bq, bkv): cost for (c, bq, bkv), cost in load_reference()["groups"][group].items() if c == chip}
    if len(probes) < 2:
        raise ValueError(f"the committed probes hold {len(probes)} tile size(s) for {chip!r}; an interpolation "
                         f"needs two or more (probed chips: "
                         f"{', '.join(sorted({c for c, _, _ in load_reference()['groups'][group]}))})")
    points: dict = {}
    for (bq, bkv), cost in probes.items():
        for kernel, kinds in cost.per_step.items():
            for kind, cycles in kinds.items():
                points.setdefault((kernel, kind), []).append((bq * bkv, cycles))
        for kernel, cycles in cost.per_row.items():
            points.setdefault((kernel, "rows"), []).append((bq, cycles))
    lines, errors = {}, {}
    for key, xy in points.items():
        if len(xy) < 2:
            continue        # probed at one size only: no line to draw
        xs, ys = zip(*xy)
        a, b = _line(xs, ys)
        lines[key] = (a, b)
        errors[key] = max(abs((a + b * x) / y - 1) for x, y in xy)
    return CostFit(chip, lines, errors, tuple(sorted(probes)))


def interpolated_cost(chip: str, block_q: int, block_kv: int, *, group: str = "after") -> TileCost:
    """The committed probe at these tiles, or the fit's `TileCost` (`evidence` says which)."""
    probed = load_reference()["groups"][group].get((chip, block_q, block_kv))
    if probed is not None:
        return probed
    fit = fit_costs(chip, group)
    per_step, per_row = {}, {}
    for (kernel, kind), (a, b) in fit.lines.items():
        if kind == "rows":
            per_row[kernel] = max(a + b * block_q, 0.0)
        else:
            per_step.setdefault(kernel, {})[kind] = max(a + b * block_q * block_kv, 0.0)
    any_probe = next(iter(load_reference()["groups"][group].values()))
    return TileCost(chip, block_q, block_kv, default_block_kv_compute(block_q, block_kv), any_probe.head_dim, per_step, per_row, {}, {}, any_probe.versions,
                    evidence=EVIDENCE)


def extrapolated(chip: str, block_q: int, block_kv: int, group: str = "after") -> bool:
    """True when `block_q * block_kv` lies outside the probed sizes' range on `chip`."""
    pairs = [bq * bkv for bq, bkv in fit_costs(chip, group).probed]
    return not min(pairs) <= block_q * block_kv <= max(pairs)


__all__ = ["CostFit", "EVIDENCE", "extrapolated", "fit_costs", "interpolated_cost"]
