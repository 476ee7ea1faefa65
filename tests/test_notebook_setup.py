"""Every notebook starts with the same setup cell (tools/setup-cell.py), and that cell finds the
repository from where a Colab reader's kernel starts, changing no installed package."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = (ROOT / "tools" / "setup-cell.py").read_text().rstrip("\n")
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_setup_cell_is_the_shared_one(path):
    cell = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert cell.source.endswith(SETUP), f"{path.name}: run tools/set-setup-cell.py to give it tools/setup-cell.py"
    assert "pip" not in SETUP.split("import svg_lib")[0].replace("pip install", ""), "the setup cell must not run pip"


def run_setup(cwd, env_extra=None):
    """Run the setup cell in a fresh interpreter that cannot import svg_lib from site-packages."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_extra or {})
    # -S: no site-packages, so an installed (editable) svg_lib is not found, nor jax: the cell's
    # last line is replaced by a check of where svg_lib would come from
    code = SETUP.replace("import svg_lib  #", "print(importlib.util.find_spec('svg_lib').origin)  #")
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True)


def test_setup_finds_a_clone_from_a_folder_outside_it(tmp_path):
    clone = tmp_path / "content" / "svg-tpu"
    (clone / "svg_lib").mkdir(parents=True)
    (clone / "svg_lib" / "__init__.py").write_text("")
    for cwd in (tmp_path / "content", clone, clone / "svg_lib"):  # /content, the clone, a folder inside it
        done = run_setup(cwd)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(clone / "svg_lib" / "__init__.py")], (cwd, done.stdout)


def test_setup_without_a_clone_says_what_to_do(tmp_path):
    done = run_setup(tmp_path, {"SVG_LIB_REPO": ""})
    assert done.returncode != 0
    assert "no clone of its repository was found" in done.stderr and "SVG_LIB_REPO" in done.stderr


def test_setup_clones_the_configured_repository(tmp_path):
    source = tmp_path / "origin"
    (source / "svg_lib").mkdir(parents=True)
    (source / "svg_lib" / "__init__.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(git + args, check=True)
    here = tmp_path / "content"
    here.mkdir()
    done = run_setup(here, {"SVG_LIB_REPO": str(source)})
    assert done.returncode == 0, done.stderr
    assert (here / "origin" / "svg_lib" / "__init__.py").is_file()
    assert done.stdout.split() == [str(here / "origin" / "svg_lib" / "__init__.py")]


def test_readme_reading_times_follow_the_notebooks():
    """The README's notebook table gives each notebook's reading time by tools/reading-times.py's rule."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("reading_times", ROOT / "tools" / "reading-times.py")
    reading = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reading)
    rows = dict(re.findall(r"^\| `([0-9A][^`]*)` \| .* \| about (\d+) min \| \w+ \|$", (ROOT / "README.md").read_text(),
                           re.M))
    notebooks = sorted((ROOT / "notebooks").glob("[0-9A]*.ipynb"))
    assert set(rows) == {p.stem for p in notebooks}, "every notebook has a row with a reading time"
    for path in notebooks:
        minutes, _ = reading.reading_minutes(path)
        assert int(rows[path.stem]) == minutes, f"{path.stem}: README says {rows[path.stem]} min, the rule gives {minutes}"
