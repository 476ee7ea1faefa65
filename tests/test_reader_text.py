"""Reader-facing text speaks about the material, never about how the project is run.

The notebooks' markdown cells (every notebook under notebooks/, so a new one is covered when it lands),
README.md, WORKSHOP.md and notebooks/GLOSSARY.md are read by learners; CONTRIBUTING.md, for whoever
changes the series, is not scanned. In them, no sentence speaks of an issue, a session, the task, a
goal or the project's brief. Whitelisted, precisely: asking a reader to report results in an issue on
the repository, and "issue" as the hardware's verb (a pipeline issues no DMA, `HIGHEST` issues six
passes); "Binder session", the hosting service's own term. Pure text and JSON: nothing runs.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROCESS = re.compile(r"\bissues?\b|\bissue's|\bsessions?\b|\bthe task\b|\bgoals?\b|\bBRIEF\b|\bpull requests?\b"
                     r"|\bhow the project is run\b", re.I)
ALLOWED = re.compile(
    r"\battach the folder to an issue on the repository\b"      # the README asks for TPU reports
    r"|\b(?:file|open) an issue\b|\bissue template\b"
    r"|\b(?:can |to )?issues? (?:no|none|six|aligned)\b"           # the hardware's verb: issues no DMA
    r"|\bBinder sessions?\b", re.I)


def documents() -> list[tuple[str, list[str]]]:
    """(name, its reader-facing texts) for every document scanned."""
    found = []
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        cells = json.loads(path.read_text())["cells"]
        found.append((str(path.relative_to(ROOT)),
                       [f"cell {i}: " + "".join(c["source"]) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]))
    for name in ("README.md", "WORKSHOP.md", "notebooks/GLOSSARY.md"):
        found.append((name, [(ROOT / name).read_text()]))
    return found


def process_words(text: str) -> list[str]:
    """'word in ...context...' for each process word of `text` outside the whitelisted phrases."""
    allowed = [m.span() for m in ALLOWED.finditer(text)]
    flat = " ".join(text.split())
    bad = []
    for match in PROCESS.finditer(text):
        if any(a <= match.start() and match.end() <= b for a, b in allowed):
            continue
        at = len(" ".join(text[:match.start()].split()))
        bad.append(f"{match[0]!r} in '...{flat[max(0, at - 60):at + 60]}...'")
    return bad


DOCUMENTS = documents()


def test_the_scan_sees_the_documents():
    names = [name for name, _ in DOCUMENTS]
    assert "README.md" in names and "notebooks/GLOSSARY.md" in names
    assert any(name.startswith("notebooks/00_") for name in names) and any("exercises/" in n for n in names)


def test_what_counts_as_a_process_word():
    assert process_words("The issue's goal is met.") and process_words("as in an earlier session")
    assert process_words("Issue 42 asks for it") and process_words("the BRIEF's figure")
    assert not process_words("a step that maps to the same tile issues no DMA; `HIGHEST` issues six")
    assert not process_words("attach the folder to an issue on the repository; a Binder session times out")
    assert not process_words("the hardware can issue aligned vector loads")


@pytest.mark.parametrize("name, texts", DOCUMENTS, ids=[name for name, _ in DOCUMENTS])
def test_reader_text_has_no_process_words(name, texts):
    bad = [f"{text.split(':', 1)[0] if text.startswith('cell ') else name}: {b}"
           for text in texts for b in process_words(text)]
    assert not bad, (f"{name} speaks of how the project is run; say what the reader needs (a recall of 0.85, a "
                     "cost under a tenth of the attention) without naming issues, sessions, tasks or goals:\n  "
                     + "\n  ".join(bad))


WORD_BUDGET = 22_000   # words of markdown in notebooks 00 to 11 and A: a new sentence is paid for by trimming another


def test_markdown_stays_within_its_word_budget():
    """The main line's markdown (notebooks 00-11 and the appendix; 12 and 13 are extensions), counted as
    whitespace-separated words, stays within WORD_BUDGET."""
    counted = {path.name: sum(len("".join(c["source"]).split()) for c in json.loads(path.read_text())["cells"]
                              if c["cell_type"] == "markdown")
               for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
               if path.name[:2] in {f"{i:02d}" for i in range(12)} or path.name.startswith("A_")}
    assert len(counted) == 13, sorted(counted)
    total = sum(counted.values())
    assert total <= WORD_BUDGET, f"{total:,} words of markdown, over the budget of {WORD_BUDGET:,}: {counted}"
