"""Checkers for the workshop's exercise notebooks (`notebooks/exercises/E1` ... `E8`).

Each `check_*` runs the learner's code on hidden cases, random and adversarial, and returns a
`CheckResult` (`.passed`, `.message`) after printing its message. It never raises for a wrong
answer: an exception inside the learner's code, or a result of the wrong type or shape, is a
failed check whose message says what happened. On failure the message names the first failing
case, what was expected and what came back, and a hint aimed at the likely mistake.

The references are svg_lib's own: `masked_softmax_times_v` for attention over kept keys, the
masks' closed-form pair counts, `Mask.tile_aligned` for B3's rounding, `plan_tiles` and
`estimate_vmem` for block sizes, `temporal_major_permutation` for the token order,
`reference_attention` for the B2 kernel, the plans' tile counts for the per-tile cost fit, and an exact
assignment solver (scipy) for the capacity-constrained assignment.
Case generators take a `seed` (fixed by default, so a verdict is reproducible); the unit tests
also run them with other seeds.

One module per exercise holds its checker and its hidden cases, named for the exercise's notebook:
`e1_online_softmax_tile`, `e2_pairs_per_tile`, `e3_b2_dispatch`, `e4_balanced_rounding`,
`e5_block_sizes`, `e6_temporal_permutation`, `e7_fit_tile_costs`, `e8_capacity_assignment`; `common` holds what they share
(`CheckResult`, the failure and case types, running the cases). This package re-exports the names
the notebooks and tests use; a name is looked up (and patched) in the module that defines it.
"""
# Beyond __all__: the path codes E3's notebook reads, and the private helpers tests/test_exercises.py calls.
from svg_lib.teaching.exercises.common import CheckResult
from svg_lib.teaching.exercises.e1_online_softmax_tile import _tile_body_cases, check_tile_body
from svg_lib.teaching.exercises.e2_pairs_per_tile import _band_reference, check_band_pair_count
from svg_lib.teaching.exercises.e3_b2_dispatch import (MASK_FREE_PATH, MASKED_PATH, b2_exercise_attention,
                                                      check_b2_dispatch)
from svg_lib.teaching.exercises.e4_balanced_rounding import check_balanced_rounding
from svg_lib.teaching.exercises.e5_block_sizes import (BlockSizeProblem, block_size_cost, block_size_problem,
                                                      check_block_sizes, compare_block_sizes)
from svg_lib.teaching.exercises.e6_temporal_permutation import check_temporal_permutation
from svg_lib.teaching.exercises.e7_fit_tile_costs import _solve_costs, case_study_stages, check_tile_cost_fit
from svg_lib.teaching.exercises.e8_capacity_assignment import check_capacity_assignment

__all__ = ["CheckResult", "check_tile_body", "check_band_pair_count", "check_b2_dispatch",
           "check_balanced_rounding", "check_block_sizes", "check_temporal_permutation", "check_tile_cost_fit",
           "check_capacity_assignment",
           "BlockSizeProblem", "block_size_problem", "block_size_cost", "compare_block_sizes", "b2_exercise_attention",
           "case_study_stages"]
