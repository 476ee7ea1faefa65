"""Every number a notebook's prose states is one a reader can find behind it.

A number in a checked notebook's markdown must appear in one of:

* an output of that notebook (what its committed run printed, so a re-run that prints something
  else makes the prose visibly stale, and the notebook's own cells are where measured orders and
  ratios belong);
* the case study's figures, the `BLOG_*` constants of `svg_lib/problem.py` (read with `ast`, no
  import: this test reads JSON and text only);
* the notebook's own list of cited figures: notebook metadata `"cited_figures"`, a JSON object
  mapping the figure as written (`"1.9x"`, `"75,600"`) to its source (a URL, a paper, or
  `"BRIEF: ..."`). A figure listed there must still occur in the prose, so the list stays short.

What counts as a number: a decimal numeral standing alone (`1,150`, `2.26`, `22 %`, `1.9x`,
`720p`), thousands separators and trailing decimal zeros ignored (`75,600` = `75600`,
`2.40` = `2.4`); a percent may state a printed fraction (`40 %` for `0.40`), and a figure the
prose calls approximate ("about 32 ms") may round a printed one (`31.9`). Not numbers: integers 0 to 10 (ordinary words), digits inside names (`v6e`, `B1`,
`bf16`, `E3`), link targets, notebook numbers written with a leading zero (`03`), sections,
cells and notebooks named by number (`section 7`, `cells 3 and 4`), dates and years, arXiv ids.
Numbers inside inline code may also match the notebook's code (they quote it).

Notebooks join `CHECKED` as their prose passes.
"""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

CHECKED = [
    "00_setup_and_tpu_primer.ipynb",
    "01_dense_attention.ipynb",
    "02_video_attention_masks.ipynb",
    "03_b1_naive_sparse.ipynb",
    "04_b2_full_edge_tiles.ipynb",
    "05_block_size_tuning.ipynb",
    "06_b3_tile_aligned.ipynb",
    "07_temporal_heads_permutation.ipynb",
    "08_svg_routing.ipynb",
    "09_scaling_out.ipynb",
    "10_sliding_tiles.ipynb",
    "11_training_with_sparse_attention.ipynb",
    "12_semantic_tiles.ipynb",
    "13_which_mask_wins.ipynb",
    "A_appendix.ipynb",
]

NUMBER = re.compile(
    r"(?<![A-Za-wyz_\d./])(?<![^\d]x)"                 # not inside a name (v6e), a version or a path
    r"(\d+(?:\.\d+){2,}"                                # a version, 0.0.42.1, compared as written
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"     # 75,600 / 2.26 / 3328
    r"(?:e[+-]?\d+)?"                                  # 2.93e13 (the mantissa is checked)
    r"(?=x\d|(?:x|p|ms|s|%)?(?!\w))"                   # 1.9x, 128x128, 720p, 32ms; not bf16's 16
)
NAMED = re.compile(r"(?:\bWan|\bsections?|\bnotebooks?|\bcells?|§|\bdeliver|\bexercises?|\barXiv|\bissues?|\bchapters?)\s*$",
                   re.I)
CHAINED = re.compile(r"^\s*(?:,|and|to|or|-|–)\s*$")
APPROX = re.compile(r"(?:about|around|roughly|nearly|almost|some|near|close to|~|≈|under|over|within|below|above|"
                    r"up to|at most|at least|less than|more than)\s*$", re.I)
MONTHS = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"


def normal(text: str) -> str:
    """The number as a plain decimal string: no separators, no trailing zeros after the point."""
    text = text.replace(",", "")
    if text.count(".") > 1:
        return text  # a version
    whole, _, fraction = text.partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def numbers(text: str) -> list[tuple[str, int]]:
    """(normalised number, position) of every numeral in `text` (no filtering)."""
    return [(normal(m[1]), m.start(1)) for m in NUMBER.finditer(text)]


def blog_figures() -> set[str]:
    """The `BLOG_*` constants of svg_lib/problem.py, keys and values, fractions also as percents."""
    found: set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k), walk(v)
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add(normal(repr(value)))
            if 0 < value < 1:
                found.add(normal(f"{value * 100:.10g}"))
        elif isinstance(value, str):
            found.update(n for n, _ in numbers(value))

    tree = ast.parse((ROOT / "svg_lib" / "problem.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("BLOG_")
                                                for t in node.targets):
            try:
                walk(ast.literal_eval(node.value))
            except ValueError:
                pass  # BLOG_URL's concatenation: no figure in it
    return found


def prose(markdown: str) -> tuple[str, str]:
    """(the prose, its inline code) of a markdown cell, link targets, URLs and HTML removed."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "] ", text)                      # link targets
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"^\s*#+\s*[\dA-Z]+(?:\.\d+)*\.?\s", " ", text, flags=re.M)  # "## 2. Title"
    text = re.sub(r"^\s*\d+\.\s", " ", text, flags=re.M)           # ordered lists
    code = " ".join(re.findall(r"`([^`]*)`", text))
    return re.sub(r"`[^`]*`", " ", text), code


def prose_numbers(text: str) -> list[tuple[str, str, bool]]:
    """(number, context, approximate?) for every number of `text` that states a figure."""
    text = re.sub(r"\b(?:19|20)\d\d-\d\d-\d\d\b", " ", text)        # dates
    text = re.sub(rf"\b{MONTHS}\s+(?:19|20)\d\d\b", " ", text)       # September 2025
    found, skipping_from = [], None
    for match in NUMBER.finditer(text):
        raw, start = match[1], match.start(1)
        before = text[max(0, start - 40):start]
        chained = skipping_from is not None and CHAINED.match(text[skipping_from:start])
        skipping_from = None
        if NAMED.search(before) or chained:
            skipping_from = match.end()
            continue
        if re.fullmatch(r"[01]\d", raw):                    # notebook numbers: 00 to 19
            continue
        if re.fullmatch(r"(?:19|20)\d\d", raw) and re.search(r"(?:\(|in|since|ICML|NeurIPS|CVPR|ICLR)\s*$", before):
            continue
        value = normal(raw)
        if re.fullmatch(r"\d+", value) and int(value) <= 10:
            continue
        found.append((value, text[max(0, start - 30):match.end() + 15].replace("\n", " "), bool(APPROX.search(before))))
    return found


def matches(figure: str, known: set[str], known_values: dict[str, list[float]], approx: bool = False) -> bool:
    """True if `figure` is known as written or as a percent of a known fraction (`40` for `0.40`);
    with `approx` (the prose said "about"), also if it rounds a known number (`32` for `31.9`)."""
    if figure in known:
        return True
    if figure.count(".") > 1:
        return False
    places = len(figure.split(".")[1]) if "." in figure else 0
    target = float(figure)
    for value in known_values["values"]:
        if 0 < value < 1 and normal(f"{value * 100:.10g}") == figure:
            return True
        if approx and any(round(v, places) == target for v in (value, value * 100)):
            return True
    return False


def known_numbers(texts) -> tuple[set[str], dict[str, list[float]]]:
    strings = {n for text in texts for n, _ in numbers(text)}
    values = sorted({float(n) for n in strings if n.count(".") <= 1})
    return strings, {"values": values}


def outputs_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for kind, data in out.get("data", {}).items():
            if kind.startswith("text/"):
                parts.append("".join(data))
        parts.append("".join(out.get("evalue", "")))
    return "\n".join(parts)


def unsupported(path: Path) -> list[str]:
    """'number: context' for each prose number the notebook does not back."""
    notebook = json.loads(path.read_text())
    cells = notebook["cells"]
    cited = notebook["metadata"].get("cited_figures", {})
    outputs = [outputs_of(c) for c in cells if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    cited_numbers = {n for figure in cited for n, _ in numbers(figure)}
    known, values = known_numbers(outputs)
    known |= BLOG | cited_numbers
    code_known, code_values = known_numbers(outputs + sources)
    code_known |= known
    bad = []
    for cell_index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text, code = prose("".join(cell["source"]))
        for figure, context, approx in prose_numbers(text):
            if not matches(figure, known, values, approx):
                bad.append(f"cell {cell_index}: {figure!r} in '...{context}...'")
        for figure, context, approx in prose_numbers(code):
            if not matches(figure, code_known, code_values, approx):
                bad.append(f"cell {cell_index}: {figure!r} (inline code) in '...{context}...'")
    return bad


BLOG = blog_figures()


def test_the_case_studys_figures_are_read():
    assert {"78.7", "96.37", "54.12", "32.76", "3328", "44.4", "1.28", "55.5"} <= BLOG


def test_what_counts_as_a_number():
    text, code = prose("## 3. Tiles\n\nIn section 7 and notebooks 03 to 06 (cells 4 and 12), v6e's B1 ran "
                       "1,150 tiles at 2.40x, 22 % of 75,600, on 2026-09-30 [blog](https://x.y/2502.04507); "
                       "720p and 3-D, libtpu 0.0.42.1, `BQ = 3328`.")
    assert [n for n, _, _ in prose_numbers(text)] == ["1150", "2.4", "22", "75600", "720", "0.0.42.1"]
    assert [n for n, _, _ in prose_numbers(code)] == ["3328"]
    known, values = known_numbers(["31.9 ms", "0.40", "2.263"])
    assert matches("40", known, values) and matches("32", known, values, approx=True)
    assert not matches("32", known, values) and not matches("2.26", known, values)
    assert matches("2.26", known, values, approx=True) and not matches("33", known, values, approx=True)
    assert [a for _, _, a in prose_numbers("about 32 ms, then 40 ms")] == [True, False]


@pytest.mark.parametrize("name", CHECKED)
def test_prose_numbers_are_backed(name):
    path = NOTEBOOKS / name
    bad = unsupported(path)
    assert not bad, (f"{name}: {len(bad)} number(s) in the markdown appear in no output of the notebook, no "
                     "BLOG_* figure and none of its metadata 'cited_figures' (figure -> source):\n  "
                     + "\n  ".join(bad))


@pytest.mark.parametrize("name", CHECKED)
def test_cited_figures_have_sources_and_are_used(name):
    notebook = json.loads((NOTEBOOKS / name).read_text())
    cited = notebook["metadata"].get("cited_figures", {})
    assert isinstance(cited, dict), "cited_figures maps a figure as written to its source"
    markdown = "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    for figure, source in cited.items():
        assert isinstance(source, str) and len(source.strip()) >= 8, f"{figure!r}: name its source"
        assert figure in markdown, f"{figure!r} is cited but no longer written in the markdown: drop it"


def test_checked_notebooks_exist():
    assert len(set(CHECKED)) == len(CHECKED)
    for name in CHECKED:
        assert (NOTEBOOKS / name).is_file(), name
