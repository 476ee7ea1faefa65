"""The repository's URL is written once, in the file REPOSITORY_URL at its root: the setup cell
(tools/setup-cell.py, copied into every notebook by tools/set-setup-cell.py) and every `git clone`
that README.md and WORKSHOP.md tell a reader to run carry that value, and the documents name the file."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
URL = (ROOT / "REPOSITORY_URL").read_text().strip()


def test_the_one_place_holds_one_line():
    lines = (ROOT / "REPOSITORY_URL").read_text().splitlines()
    assert len(lines) == 1 and lines[0].strip(), lines


def test_the_setup_cell_carries_it():
    found = re.findall(r'^REPOSITORY_URL = "(.*?)"', (ROOT / "tools" / "setup-cell.py").read_text(), re.M)
    assert found == [URL], f"tools/setup-cell.py has {found}, REPOSITORY_URL {URL!r}: run tools/set-setup-cell.py"


@pytest.mark.parametrize("name", ["README.md", "WORKSHOP.md"])
def test_the_documents_clone_it(name):
    text = (ROOT / name).read_text()
    clones = [text[m.end():m.end() + len(URL) + 20].splitlines()[0] for m in re.finditer(r"git clone ", text)]
    assert clones, f"{name} no longer tells a reader how to clone the repository"
    wrong = [c for c in clones if not c.startswith(URL)]
    assert not wrong, f"{name} clones {wrong}; REPOSITORY_URL holds {URL!r}"
    assert "`REPOSITORY_URL`" in text, f"{name} should name the file that holds the URL"


def test_one_command_sets_the_url_everywhere(tmp_path):
    """tools/set-repository-url.py, run on a copy, moves the URL into the file, the documents' clones, the
    setup cell and every notebook's copy of it; a value that is not a git URL is refused first."""
    import shutil
    import subprocess
    import sys

    import nbformat

    names = ["REPOSITORY_URL", "README.md", "WORKSHOP.md", "tools/setup-cell.py", "tools/set-setup-cell.py",
             "tools/set-repository-url.py", "notebooks/00_setup_and_tpu_primer.ipynb",
             "notebooks/exercises/E1_online_softmax_tile.ipynb"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    script = [sys.executable, str(tmp_path / "tools" / "set-repository-url.py")]
    refused = subprocess.run(script + ["<repository URL>"], capture_output=True, text=True)
    assert refused.returncode != 0 and "is not a git URL" in refused.stderr
    new = "https://example.org/someone/svg-tpu.git"
    done = subprocess.run(script + [new], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "REPOSITORY_URL").read_text() == new + "\n"
    for name in ("README.md", "WORKSHOP.md"):
        text = (tmp_path / name).read_text()
        assert f"git clone {new} " in text and (URL == new or f"git clone {URL} " not in text), name
    assert f'REPOSITORY_URL = "{new}"' in (tmp_path / "tools" / "setup-cell.py").read_text()
    for name in names[-2:]:
        cells = nbformat.read(tmp_path / name, as_version=4).cells
        assert any(f'REPOSITORY_URL = "{new}"' in c.source for c in cells if c.cell_type == "code"), name
