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
