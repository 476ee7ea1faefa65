"""The spine's knobs: each notebook 00-06 opens, after its setup cell, with a cell tagged `parameters`
(papermill's convention) holding PRESET, BLOCK_Q, BLOCK_KV and DENSITY, and runs top to bottom at tile
settings other than the shipped ones, every assertion written against those knobs."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPINE = sorted(ROOT.glob("notebooks/0[0-6]_*.ipynb"))
KNOBS = ("PRESET", "BLOCK_Q", "BLOCK_KV", "DENSITY")
# settings other than the shipped ones, at the walkthrough size: finer and coarser tiles, coarse ones
# (three query tiles: fewer rows than a cell may print, a rounding far from the budget), and a size that
# halves to no multiple of 128 with a narrower band
SETTINGS = ({"BLOCK_Q": 128, "BLOCK_KV": 256}, {"BLOCK_Q": 512, "BLOCK_KV": 128}, {"BLOCK_Q": 1024, "BLOCK_KV": 256},
            {"BLOCK_Q": 384, "BLOCK_KV": 384, "DENSITY": 0.2}, {"BLOCK_Q": 256, "BLOCK_KV": 1280})
# the two last settings run where they once broke a claim made only at the shipped tiles (the rest take the
# first two): 1024 x 256 in 03, 04 and 06; 384 x 384 at density 0.2 in 02, 04 and 06; key tiles wider than
# the band in 03 (a row may start on the tile the row before ended on: fewer copies than visited tiles)
COARSE = {2: ("03", "04", "06"), 3: ("02", "04", "06"), 4: ("03",)}
# 05 prices a second tile at the case study's size (its STUDY_ knobs): a coarse and an odd one, each in one of
# 05's runs above
STUDY_TILES = {"128x256": {"STUDY_BLOCK_Q": 640, "STUDY_BLOCK_KV": 1280},
               "512x128": {"STUDY_BLOCK_Q": 384, "STUDY_BLOCK_KV": 384}}


def _setting_id(setting):
    return f"{setting['BLOCK_Q']}x{setting['BLOCK_KV']}" + (f"-d{setting['DENSITY']}" if "DENSITY" in setting else "")


def _parameters_cell(path):
    cells = json.loads(path.read_text())["cells"]
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    return cells, tagged


@pytest.mark.parametrize("path", SPINE, ids=lambda p: p.stem)
def test_spine_notebook_opens_with_its_knobs(path):
    cells, tagged = _parameters_cell(path)
    assert len(tagged) == 1, f"{path.name}: one cell tagged 'parameters' after the setup cell, found {len(tagged)}"
    code_before = [c for c in cells[:tagged[0]] if c["cell_type"] == "code"]
    assert len(code_before) == 1, f"{path.name}: the parameters cell must come right after the setup cell"
    source = "".join(cells[tagged[0]]["source"])
    missing = [k for k in KNOBS if f"{k} =" not in source]
    assert not missing, f"{path.name}: its parameters cell lacks {missing}"


@pytest.mark.knobs
@pytest.mark.parametrize("path, setting", [(p, s) for p in SPINE for j, s in enumerate(SETTINGS)
                                           if j < 2 or p.name[:2] in COARSE.get(j, ())],
                         ids=lambda x: x.stem if isinstance(x, Path) else _setting_id(x))
def test_spine_notebook_runs_at_other_tiles(path, setting, tmp_path):
    import papermill

    study = STUDY_TILES[_setting_id(setting)] if path.name.startswith("05") else {}
    papermill.execute_notebook(str(path), str(tmp_path / path.name),
                               parameters=dict(setting, PRESET="walkthrough", **study),
                               cwd=str(path.parent), kernel_name="python3", progress_bar=False)
