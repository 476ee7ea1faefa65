"""Every notebook starts with the same setup cell (tools/setup-cell.py), and that cell finds the
repository from where a Colab reader's kernel starts, changing no installed package."""
import os
import re
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
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    at = next((i for i, c in enumerate(code) if "# Setup: make" in c.source), None)
    assert at is not None, f"{path.name}: no setup cell; run tools/set-setup-cell.py"
    assert code[at].source.endswith(SETUP), f"{path.name}: run tools/set-setup-cell.py to give it tools/setup-cell.py"
    early = [c.source for c in code[:at] if re.search(r"^\s*(import|from)\s+(jax|svg_lib)\b", c.source, re.M)]
    assert not early, f"{path.name}: a cell before the setup cell imports jax or svg_lib"
    assert "pip" not in SETUP.split("import svg_lib")[0].replace("pip install", ""), "the setup cell must not run pip"


def run_setup(cwd, env_extra=None, colab_url=None):
    """Run the setup cell in a fresh interpreter that cannot import svg_lib from site-packages; with
    `colab_url`, as on Colab (google.colab imported) with that URL as the cell's REPOSITORY_URL."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SVG_LIB_REPO")}
    env.update(env_extra or {})
    # -S: no site-packages, so an installed (editable) svg_lib is not found, nor jax: the cell's
    # last line is replaced by a check of where svg_lib would come from
    code = SETUP.replace("import svg_lib  #", "print(importlib.util.find_spec('svg_lib').origin)  #")
    if colab_url is not None:
        code = re.sub(r'^REPOSITORY_URL = ".*?"', f"REPOSITORY_URL = {str(colab_url)!r}", code, count=1, flags=re.M)
        code = 'import sys, types; sys.modules["google.colab"] = types.ModuleType("google.colab")\n' + code
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


def a_repository(tmp_path):
    source = tmp_path / "origin"
    (source / "svg_lib").mkdir(parents=True)
    (source / "svg_lib" / "__init__.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(git + args, check=True)
    here = tmp_path / "content"
    here.mkdir()
    return source, here


def test_setup_clones_the_configured_repository(tmp_path):
    source, here = a_repository(tmp_path)
    done = run_setup(here, {"SVG_LIB_REPO": str(source)})
    assert done.returncode == 0, done.stderr
    assert (here / "origin" / "svg_lib" / "__init__.py").is_file()
    assert done.stdout.split() == [str(here / "origin" / "svg_lib" / "__init__.py")]


def test_setup_clones_the_repository_on_colab_only(tmp_path):
    """On Colab with no clone around, the cell clones REPOSITORY_URL by itself; elsewhere it never does."""
    source, here = a_repository(tmp_path)
    assert run_setup(here).returncode != 0 and not (here / "origin").exists()
    done = run_setup(here, colab_url=source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(here / "origin" / "svg_lib" / "__init__.py")]


def test_setup_says_why_a_clone_failed(tmp_path):
    done = run_setup(tmp_path, colab_url=tmp_path / "nowhere")
    assert done.returncode != 0
    assert f"git could not clone {tmp_path / 'nowhere'}" in done.stderr and "SVG_LIB_REPO" in done.stderr


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


def test_setup_on_colab_before_publication_says_what_to_do(tmp_path):
    """While REPOSITORY_URL holds its placeholder, the cell on Colab clones nothing and says in one sentence
    what to do, instead of failing with git's message about a URL that is not one."""
    done = run_setup(tmp_path, colab_url="<repository URL>")
    assert done.returncode != 0
    assert "git could not clone" not in done.stderr
    assert "has no repository URL yet" in done.stderr and "tools/set-repository-url.py URL" in done.stderr
