"""WORKSHOP.md walks the instructor through the demos cell by cell; what it names must be there.

In its section "### The demos, cell by cell" each bullet opens with its notebook in bold
(`**03.**`, `**06, sections 6 and 7.**`), and names the cells to run as "cell `<first line>`":
the cell's first line as it reads, or its start followed by "..." where the line is long. Every
such cell must exist in that notebook, and every other snippet a bullet quotes in backticks (an
output such as `95/200 visited, 41 masked`, a name such as `num_scalar_prefetch=2`) must appear in
that notebook's code, outputs or prose, so a note cannot outlive the cell it describes.
Pure text and JSON: nothing runs.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKSHOP = ROOT / "WORKSHOP.md"
NOTEBOOKS = ROOT / "notebooks"

CELL = re.compile(r"\b[Cc]ells? `([^`]+)`")
SNIPPET = re.compile(r"`([^`]+)`")
ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)$")


def demo_bullets() -> list[tuple[str, str]]:
    """(notebook prefix such as "03", the bullet's text) for each bullet of the demos section."""
    text = WORKSHOP.read_text()
    start = text.index("### The demos, cell by cell")
    end = text.index("\n#", start + 1)
    bullets, current = [], None
    for line in text[start:end].splitlines():
        opening = re.match(r"- \*\*(\d\d|A)\b", line)
        if opening:
            current = [opening[1], line]
            bullets.append(current)
        elif current is not None and line.startswith("  "):
            current[1] += "\n" + line
        else:
            current = None
    return [(prefix, body) for prefix, body in bullets]


def notebook(prefix: str) -> dict:
    (path,) = NOTEBOOKS.glob(f"{prefix}_*.ipynb")
    return json.loads(path.read_text())


def first_lines(nb: dict) -> list[str]:
    return ["".join(c["source"]).split("\n")[0] for c in nb["cells"] if c["cell_type"] == "code"]


def everything(nb: dict) -> str:
    """The notebook's code, markdown and text outputs, as one string."""
    parts = []
    for cell in nb["cells"]:
        parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.extend("".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def flat(text: str) -> str:
    return " ".join(text.split())


BULLETS = demo_bullets()


def test_the_demos_section_names_cells():
    assert len(BULLETS) >= 8, "the demos section has lost its bullets (or their '- **NN' openings)"
    for prefix, body in BULLETS:
        assert CELL.search(body), f"the bullet for {prefix} names no cell as cell `<first line>`"


@pytest.mark.parametrize("prefix, body", BULLETS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BULLETS)])
def test_named_cells_exist_and_begin_as_quoted(prefix, body):
    lines = first_lines(notebook(prefix))
    missing = []
    for quoted in CELL.findall(body.replace("\n  ", " ")):
        start = ELLIPSIS.sub("", quoted)
        exact = not ELLIPSIS.search(quoted)
        if not any(line == start if exact else line.startswith(start) for line in lines):
            missing.append(quoted)
    assert not missing, (f"WORKSHOP.md names cells of notebook {prefix} whose first line no code cell has "
                         f"(quote a long line's start and end it with '...'): {missing}")


@pytest.mark.parametrize("prefix, body", BULLETS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BULLETS)])
def test_quoted_snippets_are_in_the_notebook(prefix, body):
    haystack = flat(everything(notebook(prefix)))
    text = body.replace("\n  ", " ")
    cells = set(CELL.findall(text))
    stale = [s for s in SNIPPET.findall(text)
             if s not in cells and flat(ELLIPSIS.sub("", s)) not in haystack]
    assert not stale, f"WORKSHOP.md quotes, for notebook {prefix}, what the notebook no longer holds: {stale}"
