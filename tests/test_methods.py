"""The method table: one record per method, and no other module comparing method names."""
import ast
import re
from pathlib import Path

import pytest

import importlib

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.methods import (BACKWARD_METHODS, BASELINE, DEFAULT_METHODS, MASKED_METHODS, METHODS, MODEL_METHODS,
                             PALLAS_METHODS, PLANNED_METHODS, SERIES_FIRST_METHODS, SERIES_METHODS,
                             SPLASH_FIRST_METHODS, SPLASH_METHODS, check_method, check_methods)
from svg_lib.problem import PALLAS_METHODS as PROBLEM_PALLAS_METHODS

ROOT = Path(__file__).resolve().parents[1]
MASK = SVGMask.spatial(VideoGeometry(4, 8, 10), 0.4)
NAMES = "|".join(METHODS)
# `method == "b1"`, `"b3" != method`, `method in ("dense", "splash_dense")`: a module deciding by a name
COMPARISON = re.compile(rf'(==|!=)\s*"({NAMES})"|"({NAMES})"\s*(==|!=)|(?<!for )\b\w+\s+(not\s+)?in\s+\(\s*"({NAMES})"')


def test_every_method_attention_takes_has_one_record():
    assert tuple(METHODS) == importlib.import_module("svg_lib.attention").METHODS
    assert PROBLEM_PALLAS_METHODS == PALLAS_METHODS == tuple(n for n in METHODS if n != "reference")
    assert SPLASH_METHODS == ("splash_dense", "splash") and BASELINE in SPLASH_METHODS
    assert PLANNED_METHODS == ("b1", "b2", "b3") and set(PLANNED_METHODS) <= set(MASKED_METHODS)


def test_the_mask_each_kernel_computes():
    assert METHODS["dense"].computed_mask(MASK, 128, 128) is None
    assert METHODS["splash_dense"].computed_mask(MASK, 128, 128) is None
    for name in ("reference", "splash", "b1", "b2"):
        assert METHODS[name].computed_mask(MASK, 128, 128) is MASK
    aligned = METHODS["b3"].computed_mask(MASK, 128, 256)
    assert (aligned.to_dense() == MASK.tile_aligned(128, 256).to_dense()).all()
    assert [n for n, m in METHODS.items() if m.masks_full_tiles] == ["b1"]


def test_what_the_memory_estimates_read_off_the_records():
    # every series kernel builds masks in VMEM on some tiles (dense: key padding), and the VMEM
    # estimate counts them from this field: a new stage without it would be estimated too small
    assert [n for n, m in METHODS.items() if m.tile_masks] == [n for n, m in METHODS.items() if m.family == "svg_lib"]
    assert BACKWARD_METHODS == ("dense", "b1", "b2", "b3")


def test_bad_names_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown method 'B3' \(did you mean 'b3'\?\); valid: reference, dense"):
        check_method("B3")
    with pytest.raises(ValueError, match="unknown stage 'dense'; valid: b1, b2, b3"):
        check_method("dense", PLANNED_METHODS, what="stage")
    with pytest.raises(ValueError, match="give at least one method"):
        check_methods(())
    assert check_method("b2").name == "b2" and check_methods(["b1", "b3"]) == ("b1", "b3")


def test_no_module_but_the_table_compares_method_names():
    """What a method does is asked of its record; the comparisons a grep would find are gone."""
    found = []
    for path in sorted((ROOT / "svg_lib").rglob("*.py")):
        if path.name == "methods.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if COMPARISON.search(code) and "kernel ==" not in code and "p.kernel" not in code:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "ask svg_lib.methods instead:\n" + "\n".join(found)


def test_the_guard_finds_a_comparison():
    assert COMPARISON.search('if method == "b3":') and COMPARISON.search('method in ("dense", "splash_dense")')
    assert not COMPARISON.search('for m in METHODS:') and not COMPARISON.search('for m in ("b1", "b2"):')


# Where the kernel itself reads `masks_full_tiles`: the dispatch and the forward's count of bodies.
MASKS_FULL_TILES_SITES = {"svg_lib/methods.py", "svg_lib/kernels/grid.py", "svg_lib/kernels/forward.py"}


def hand_kept_lists(source: str) -> list[int]:
    """Lines of tuples, lists or sets of three or more method-name literals (a selection the table
    makes: `PLANNED_METHODS`, `SERIES_METHODS`, ...); a pair is a chosen comparison and may stay."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 3 and all(
                isinstance(e, ast.Constant) and e.value in METHODS for e in node.elts):
            found.append(node.lineno)
    return found


def test_method_lists_and_full_tile_branches_are_read_off_the_table():
    found = []
    for path in sorted((ROOT / "svg_lib").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py")):
        name, source = str(path.relative_to(ROOT)), path.read_text()
        if name == "svg_lib/methods.py":
            continue
        if "masks_full_tiles" in source and name not in MASKS_FULL_TILES_SITES:
            found.append(f"{name}: reads masks_full_tiles (ask the record: step_classes, mask_free_body)")
        found += [f"{name}:{line}: a hand-kept list of methods" for line in hand_kept_lists(source)]
    assert not found, "take these from svg_lib.methods:\n" + "\n".join(found)


def test_the_list_guard_finds_a_list_and_the_selectors_keep_their_order():
    assert hand_kept_lists('M = ("splash_dense", "dense", "b1")\nf(x, ["b1", "b2", "b3"])\n') == [1, 2]
    assert not hand_kept_lists('PAIR = ("b2", "b3")\n"""("b1", "b2", "b3")"""\nK = ("b1", "b2", "x")\n')
    assert DEFAULT_METHODS == ("splash_dense", "dense", "splash", "b1", "b2", "b3")
    assert MODEL_METHODS == ("splash_dense", "dense", "b1", "b2", "b3")
    assert SPLASH_FIRST_METHODS == ("splash_dense", "splash", "dense", "b1", "b2", "b3")
    assert SERIES_FIRST_METHODS == ("dense", "b1", "b2", "b3", "splash_dense", "splash")
    assert [n for n, m in METHODS.items() if not m.mask_free_body] == ["b1"]
