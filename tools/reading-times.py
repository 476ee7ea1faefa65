#!/usr/bin/env python3
"""Reading time of each notebook, as the README's table gives it.

    python tools/reading-times.py            # print "notebook: N min (W words)" for every notebook

Words of markdown at 120 a minute, the pace of a careful reader of technical prose who checks
each claim against the cell below it (skimming runs near 250), plus one minute per code cell
(reading the code and its output, not running it), rounded to the nearest 5 minutes (at least 5).
tests/test_notebook_setup.py holds the README's column to this rule.
"""
import json
import math
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE = 120
MINUTES_PER_CODE_CELL = 1.0


def reading_minutes(path: Path) -> tuple[int, int]:
    """(minutes, markdown words) of one notebook."""
    cells = json.loads(path.read_text())["cells"]
    words = sum(len(re.findall(r"\S+", "".join(c["source"]))) for c in cells if c["cell_type"] == "markdown")
    code = sum(1 for c in cells if c["cell_type"] == "code")
    minutes = words / WORDS_PER_MINUTE + code * MINUTES_PER_CODE_CELL
    return max(5, 5 * math.floor(minutes / 5 + 0.5)), words


def main(folder: Path) -> None:
    for path in sorted(folder.glob("[0-9A]*.ipynb")):
        minutes, words = reading_minutes(path)
        print(f"{path.stem}: {minutes} min ({words:,} words)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "notebooks")
