"""What each form of the schedule would take in SMEM, for notebooks 03 and 05 and the tests.

The kernels pass one form, the packed one (`svg_lib.memory.smem.schedule_smem`: two 16-bit steps
per int32 word); this module prices the others beside it with the same padding rule, analytically
(no compiler): `schedule_forms` for one schedule, `largest_fitting_steps` for where a 1-D form stops
fitting, `smem_table` for SVG masks at several video sizes (CONTRIBUTING.md, "Measurements behind
the kernels", has the table).
"""
from __future__ import annotations

from svg_lib.core.planner import plan_tiles
from svg_lib.core.svg_masks import SVGMask
from svg_lib.memory.smem import KiB, VECTOR_WORDS, WORD, _bound_rows, estimate_smem, fixed_bytes, schedule_smem, table_bytes
from svg_lib.methods import METHODS, PLANNED_METHODS
from svg_lib.problem import check_method
from svg_lib.runtime import smem_capacity

FORMS = ("packed", "flat", "two_tables")


def schedule_forms(heads: int, rows: int, steps: int, generation: str | None = None) -> dict:
    """{form: SmemEstimate} for one schedule of `rows` x `steps` in each table form:

    * "packed": what the kernels use, two 16-bit steps per int32 word (`schedule_smem`);
    * "flat": one int32 word per step (`kv_index << 2 | class`), `[rows * steps]`;
    * "two_tables": the series' first form, `kv_index` and `step_class` as two `[rows, steps]`
      int32 tables, each stored in (8, 128)-word tiles.
    """
    return {"packed": schedule_smem(heads, rows, steps, generation),
            "flat": estimate_smem({"head_kind": (heads,), "schedule": (rows * steps,), **_bound_rows(heads)},
                                  generation),
            "two_tables": estimate_smem({"kv_index": (rows, steps), "step_class": (rows, steps),
                                         **_bound_rows(heads)}, generation)}


def largest_fitting_steps(form: str, heads: int = 1, generation: str | None = None) -> int:
    """The most grid steps (rows x steps, one kind) a schedule of `form` can hold, for a 1-row estimate
    of `form` ("packed" or "flat"); "two_tables" depends on the row count, see `schedule_forms`."""
    if form not in ("packed", "flat"):
        raise ValueError(f"largest_fitting_steps answers for 'packed' or 'flat', got {form!r}")
    per_word = 2 if form == "packed" else 1
    _, capacity = smem_capacity(generation)
    beside = table_bytes((heads,)) + sum(table_bytes(shape) for shape in _bound_rows(heads).values())
    words = (capacity - fixed_bytes() - beside) // WORD
    return (words // VECTOR_WORDS) * VECTOR_WORDS * per_word


def smem_table(geometries: dict, density: float = 0.35, blocks=((512, 512), (3328, 1536)),
               methods=("b2", "b3"), generation: str = "v6e") -> list[dict]:
    """SMEM of each table form for SVG masks of `geometries` {name: VideoGeometry}, one head.

    Analytic: planned schedules and `svg_lib.memory.smem`'s padding rule (no compiler). One dict per
    (geometry, blocks, method) with the plan's rows x steps and each form's KiB and fit.
    """
    out = []
    for name, geometry in geometries.items():
        mask = SVGMask.spatial(geometry, density)
        for bq, bkv in blocks:
            for method in methods:
                plan = plan_tiles(METHODS[check_method(method, PLANNED_METHODS)].computed_mask(mask, bq, bkv), bq, bkv)
                forms = schedule_forms(1, plan.grid[0], plan.steps, generation)
                row = {"geometry": name, "tokens": geometry.tokens, "block_q": bq, "block_kv": bkv,
                       "method": method, "rows": plan.grid[0], "steps": plan.steps}
                for form, e in forms.items():
                    row[form + "_kib"] = e.total / KiB
                    row[form + "_fits"] = e.fits
                out.append(row)
    return out
