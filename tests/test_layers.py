"""svg_lib's layers (ARCHITECTURE.md), checked: import-linter's contracts in pyproject.toml, and
every import of svg_lib's own modules at the top of the module that makes it."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "svg_lib"


def test_import_linter_contracts_hold(monkeypatch, capsys):
    # layers: each imports only from the layers below; acyclic_siblings: no import cycles
    cli = pytest.importorskip("importlinter.cli")
    monkeypatch.chdir(ROOT)
    code = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "4 kept, 0 broken" in out


def _function_level_svg_lib_imports(path: pathlib.Path, base: pathlib.Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                names = []
                if isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith("svg_lib")):
                    names = [inner.module or "."]
                elif isinstance(inner, ast.Import):
                    names = [a.name for a in inner.names if a.name.startswith("svg_lib")]
                found += [f"{path.relative_to(base)}:{inner.lineno} {n}" for n in names]
    return found


def test_svg_lib_modules_are_imported_at_the_top():
    # a reader sees from a module's head what it depends on; only optional heavy libraries
    # (jax's pieces, matplotlib, ipywidgets, playwright) may be imported inside functions
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _function_level_svg_lib_imports(path)]
    assert not found, "\n".join(found)


def test_the_top_of_module_check_can_fail(tmp_path):
    # a negative control: function-level imports of svg_lib, absolute and relative, are caught;
    # a function-level import of another library is not
    sample = tmp_path / "sample.py"
    sample.write_text("import json\n\ndef f():\n    from svg_lib.core import masks\n    import svg_lib.chips\n"
                      "    from . import plots\n    import matplotlib\n    return masks\n")
    hits = _function_level_svg_lib_imports(sample, tmp_path)
    assert hits == ["sample.py:4 svg_lib.core", "sample.py:5 svg_lib.chips", "sample.py:6 ."]


def _paths_into_notebooks(path: pathlib.Path, base: pathlib.Path = ROOT) -> list[str]:
    """String constants (docstrings aside) that name the notebooks/ folder: a path being built."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [f"{path.relative_to(base)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and (node.value.strip("/\\") == "notebooks" or "notebooks/" in node.value or "notebooks\\" in node.value)]


def test_svg_lib_never_reads_the_notebooks_folder():
    # the package stands alone (an installed wheel has no notebooks/): the data it reads is package
    # data in svg_lib/data; the notebooks find their own recorded data and pass it in
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _paths_into_notebooks(path)]
    assert not found, "\n".join(found)


def test_the_notebooks_folder_check_can_fail(tmp_path):
    # a negative control: a path built from "notebooks" is caught, docstrings and other strings are not
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads notebooks/data/x.json."""\nfrom pathlib import Path\n\n'
                      'def f():\n    """notebooks/ in a docstring."""\n    return Path(__file__).parent / "notebooks" / "x"\n\n'
                      'G = "notebooks/data/y.json"\nH = "notebook 12"\n')
    assert sorted(_paths_into_notebooks(sample, tmp_path)) == ["sample.py:6 'notebooks'", "sample.py:8 'notebooks/data/y.json'"]


# The lesson core, each folder or module once: what a reader walks through floor by floor. What only
# the layers above `attention` or the instruments need lives in extensions/. The goal is 3,500 lines;
# the ceiling is where the core stands now (with grid.Pieces, the learner's way in, and forward.code_bytes, the
# unroll rule's price of a program: 3,467 lines) plus 30 for an addition to kernels/forward.py under way, lowered
# as it shrinks.
LESSON_CORE = ("core", "kernels", "memory", "attention.py")
LESSON_CORE_GOAL, LESSON_CORE_CEILING = 3_500, 3_463


def lesson_core_lines(package: pathlib.Path = PACKAGE) -> dict[str, int]:
    """{path relative to the package: lines} of every module of the lesson core."""
    paths = sorted({p for name in LESSON_CORE
                    for p in ([package / name] if name.endswith(".py") else (package / name).glob("*.py"))})
    return {str(p.relative_to(package)): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}


def test_the_lesson_core_stays_small():
    lines = lesson_core_lines()
    total = sum(lines.values())
    biggest = ", ".join(f"{name} {n}" for name, n in sorted(lines.items(), key=lambda kv: -kv[1])[:5])
    assert total <= LESSON_CORE_CEILING, (
        f"the lesson core is {total:,} lines, over its ceiling of {LESSON_CORE_CEILING:,} (goal "
        f"{LESSON_CORE_GOAL:,}); the biggest modules: {biggest}. Move what only layers or instruments use to "
        f"svg_lib/extensions/, or remove a repetition")
    assert set(lines) >= {"attention.py", "core/planner.py", "kernels/forward.py", "memory/vmem.py"}
