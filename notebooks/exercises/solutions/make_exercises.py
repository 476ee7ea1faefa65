"""Write the learner's exercise notebooks from the solved ones in this folder.

    python notebooks/exercises/solutions/make_exercises.py          # rewrite notebooks/exercises/E*.ipynb
    python notebooks/exercises/solutions/make_exercises.py --check  # exit 1 if any is out of date

The solved notebooks here are the source of truth: CI runs them under nbval with their committed
outputs. A learner's copy is the same notebook with
  * the lines from `# BEGIN SOLUTION` to `# END SOLUTION` replaced by a `raise NotImplementedError`
    stub (same indentation), and the cell's "solution" tag renamed "exercise";
  * cells tagged "solution-note" (the instructor's banner) left out;
  * every output, execution count and execution timestamp cleared, so a learner starts clean.
Edit a solved notebook, rerun it (nbconvert --execute --inplace), then rerun this script.
"""
from __future__ import annotations

import copy
import pathlib
import re
import sys

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
EXERCISES = HERE.parent
_BLOCK = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\n.*?^[ \t]*# END SOLUTION\n?", re.M | re.S)


def stub_source(source: str, exercise: str) -> str:
    """`source` with every solution block replaced by a stub that raises NotImplementedError."""
    if "# BEGIN SOLUTION" not in source:
        return source
    out, count = _BLOCK.subn(
        lambda m: f'{m["indent"]}raise NotImplementedError("{exercise}: replace this line with your code")\n', source)
    if count != source.count("# BEGIN SOLUTION"):
        raise ValueError(f"{exercise}: unmatched BEGIN/END SOLUTION markers in:\n{source}")
    return out.rstrip("\n")


def learner_notebook(solved: nbformat.NotebookNode, exercise: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(solved)
    cells = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "solution-note" in tags:
            continue
        cell.metadata.pop("execution", None)  # nbclient's timestamps from the solved run
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source, exercise)
            cell.outputs = []
            cell.execution_count = None
            if "solution" in tags:
                cell.metadata["tags"] = ["exercise" if t == "solution" else t for t in tags]
        cells.append(cell)
    nb.cells = cells
    return nb


def solved_notebooks() -> list[pathlib.Path]:
    return sorted(HERE.glob("E*.ipynb"))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path in solved_notebooks():
        exercise = path.name.split("_")[0]
        text = nbformat.writes(learner_notebook(nbformat.read(path, as_version=4), exercise)) + "\n"
        target = EXERCISES / path.name
        if target.exists() and target.read_text() == text:
            continue
        stale.append(target)
        if not check:
            target.write_text(text)
            print(f"wrote {target.relative_to(EXERCISES.parent.parent)}")
    if check and stale:
        print("out of date (run notebooks/exercises/solutions/make_exercises.py): "
              + ", ".join(p.name for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
