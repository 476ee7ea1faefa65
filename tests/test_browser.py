"""The mask explorer in a real browser: JupyterLab, headless Chromium, a slider moved by a "user".

The unit tests drive the explorer from Python (`explorer.block_q.value = 256`). This test checks
what they cannot: that the widget renders in JupyterLab, that the front end talks to the kernel,
and that moving a slider in the page redraws the tile map and the statistics. It

1. writes a two-cell notebook (setup, then `svg_lib.mask_explorer()`) into a temporary folder
   with its own Jupyter config, data and runtime folders and a kernelspec for this interpreter;
2. starts JupyterLab on 127.0.0.1 (a free port, a random token, no browser);
3. opens the notebook in Debian's Chromium (`/usr/bin/chromium`), driven by Playwright over
   CDP with a fresh profile (Playwright's own browser downloads are never used);
4. runs the explorer cell (Run > Run All Cells), waits for the widget, moves the block_q slider one
   step with the keyboard, and checks that the tile map's image and the tile count change; then
   picks "sliding tiles" and checks that the cube sliders appear and the window's plan is shown;
5. saves a screenshot to artifacts/browser/explorer.png and stops JupyterLab whatever happens.

Without Chromium or Playwright the test is skipped, except under CI (the `CI` environment
variable set), where that is a failure: `make test` installs both (see the Makefile), so CI
must really run it.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts" / "browser"
SCREENSHOT = ARTIFACTS / "explorer.png"
# Flags for a quiet, self-contained headless run: no sandbox (containers often run as root),
# no GPU, and none of the background traffic (updates, sync, QUIC) a desktop browser starts.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 120   # JupyterLab up and answering /api/status
WIDGET_S = 120         # kernel start + `import svg_lib` (jax) + the first tile map
UPDATE_S = 60          # one slider step: a replan and a redraw in the kernel
RUN_RETRY_S = 15      # after Run All Cells, how long the cell may take to show it started
KERNEL_NAME = "svg-lib-browser-test"


def _missing_browser_reason() -> str | None:
    if not CHROMIUM.is_file():
        return (f"{CHROMIUM} not found: install Debian's chromium (make test and make setup do it as root with apt-get: "
                "apt-get install -y --no-install-recommends chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (it is in the dev extra: pip install -e '.[dev]')"
    return None


def _require_browser():
    reason = _missing_browser_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the browser test must run, but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_notebook(path: Path) -> None:
    """A notebook with one code cell: make svg_lib importable, build the explorer, show it."""
    def code(source):
        return {"cell_type": "code", "id": "explorer", "execution_count": None, "metadata": {}, "outputs": [],
                "source": source}

    notebook = {
        "cells": [
            {"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# Explorer, in a browser"},
            code(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport svg_lib\n\n"
                 "explorer = svg_lib.mask_explorer()\nexplorer"),
        ],
        "metadata": {"kernelspec": {"name": KERNEL_NAME, "display_name": "svg_lib test", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")


def _jupyter_env(base: Path) -> dict:
    """Environment for a JupyterLab that reads nothing from the user's Jupyter folders.

    Config, data and runtime folders are fresh, and the data folder holds one kernelspec that
    runs this very interpreter, so the kernel sees the same svg_lib, jax and ipywidgets.
    """
    env = dict(os.environ)
    for name in ("config", "data", "runtime"):
        (base / name).mkdir()
    env.update(JUPYTER_CONFIG_DIR=str(base / "config"), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), JUPYTER_PATH=str(base / "data"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    spec_dir = base / "data" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "svg_lib test", "language": "python", "env": {"PYTHONPATH": str(ROOT)}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return env


class JupyterLab:
    """A JupyterLab server in its own process group; `stop()` ends it and its kernels."""

    def __init__(self, root_dir: Path, base: Path):
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "jupyterlab.log"
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root_dir}",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # Jupyter refuses root without it; CI containers run as root
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=root_dir,
                                        env=_jupyter_env(base), start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on {self.url} within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        # SIGTERM lets the server shut its kernels down; the process group catches stragglers.
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group this test started, nothing else
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def jupyterlab(tmp_path):
    _require_browser()
    root_dir = tmp_path / "notebooks"
    root_dir.mkdir()
    _write_notebook(root_dir / "explorer.ipynb")
    server = JupyterLab(root_dir, tmp_path)
    try:
        server.wait_ready(SERVER_START_S)
        yield server
    finally:
        server.stop()


def _expected_tiles(block_q: int, block_kv: int) -> str:
    """The tile count the explorer's statistics should print, computed here from the planner."""
    from svg_lib import SVGMask, plan_tiles
    from svg_lib.teaching.explorer import DEFAULT_GEOMETRY

    s = plan_tiles(SVGMask.spatial(DEFAULT_GEOMETRY, 0.35), block_q, block_kv).stats
    return f"{s['q_tiles']} x {s['kv_tiles']} = {s['tiles_total']:,} of {block_q} x {block_kv}"


def _expected_sliding_tiles(block_q: int, block_kv: int) -> str:
    """The "B2 full/edge" row the explorer should show for its default sliding-tile mask, from the planner."""
    from svg_lib import SlidingTileMask, plan_tiles
    from svg_lib.teaching.explorer import DEFAULT_CUBE, DEFAULT_GEOMETRY, DEFAULT_WINDOW

    s = plan_tiles(SlidingTileMask(DEFAULT_GEOMETRY, DEFAULT_CUBE, DEFAULT_WINDOW), block_q, block_kv).stats
    return f"B2 full/edge{s['tiles_visited']:,}{s['tiles_masked']:,}{s['grid_steps']:,}"


def _wait_for_redraw(page, stats_text: str, old_src: str) -> None:
    """Wait until the statistics show `stats_text` and the tile map's image is no longer `old_src`."""
    page.wait_for_function("([sel, text]) => document.querySelector(sel).textContent.includes(text)",
                           arg=[".svg-stats", stats_text])
    page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel);"
                           " return i && i.getAttribute('src') && i.getAttribute('src') !== old; }",
                           arg=[".svg-tile-map img, img.svg-tile-map", old_src])


def _dismiss_news_prompt(page) -> None:
    """Answer JupyterLab's "notified about Jupyter news?" toast, if it shows, so it hides nothing."""
    button = page.locator(".jp-toast-button", has_text="No")
    try:
        button.first.click(timeout=5000)
    except Exception:  # the prompt did not appear (newer or configured JupyterLab): nothing to do
        pass


def _run_all_cells(page) -> None:
    """Run the notebook as a reader would (Run menu > Run All Cells) and wait until it has started.

    On a busy machine JupyterLab can show the kernel as idle a moment before the notebook
    accepts commands: the menu item is then disabled, and clicking it leaves the menu open and
    runs nothing. So each try closes any open menu first, clicks only an enabled item, and the
    code cell's prompt says whether it ran ("[ ]:" never ran, "[*]:" running, "[1]:" done).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    prompt = page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").first
    menu = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first
    item = page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                        has_text=re.compile(r"^Run All Cells$")).first
    deadline = time.monotonic() + WIDGET_S
    tries = 0
    while time.monotonic() < deadline:
        tries += 1
        page.keyboard.press("Escape")  # a menu left open by an earlier try would swallow the next click
        menu.click()
        try:
            item.click(timeout=5000)
        except PlaywrightTimeout:  # the item is still disabled: try again shortly
            continue
        started = time.monotonic() + RUN_RETRY_S
        while time.monotonic() < started:
            if prompt.inner_text().strip() not in ("[ ]:", ""):
                return
            page.wait_for_timeout(250)
    raise AssertionError(f"the explorer cell did not start within {WIDGET_S} s ({tries} tries of Run > Run All "
                         f"Cells); its prompt reads {prompt.inner_text()!r}")


def test_explorer_slider_redraws_tile_map_in_chromium(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in (SCREENSHOT, ARTIFACTS / "explorer-failure.png"):
        old.unlink(missing_ok=True)  # a picture from an earlier run must not pass for this one
    with sync_playwright() as p:
        # A persistent context is how Playwright takes a profile folder (--user-data-dir).
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1700})
        page = context.new_page()
        page.set_default_timeout(UPDATE_S * 1000)
        try:
            page.goto(f"{jupyterlab.url}/lab/tree/explorer.ipynb?token={jupyterlab.token}",
                      timeout=SERVER_START_S * 1000)
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=SERVER_START_S * 1000)
            # Wait for the kernel to be up before running anything (the status reads "Idle").
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-Notebook-ExecutionIndicator, "
                ".jp-Toolbar-kernelStatus, [data-jp-item-name=\"kernelStatus\"]')]"
                ".some(e => /idle/i.test(e.getAttribute('title') || '') || /idle/i.test(e.textContent || ''))",
                timeout=WIDGET_S * 1000)

            _dismiss_news_prompt(page)
            _run_all_cells(page)
            page.locator(".svg-explorer").wait_for(state="visible", timeout=WIDGET_S * 1000)
            image = page.locator(".svg-tile-map img, img.svg-tile-map").first
            image.wait_for(state="visible")
            stats = page.locator(".svg-stats")
            before_src = image.get_attribute("src")
            before_tiles = _expected_tiles(128, 128)
            page.wait_for_function("([sel, text]) => document.querySelector(sel).textContent.includes(text)",
                                   arg=[".svg-stats", before_tiles])
            assert before_src, "the tile map <img> has no src before the slider moved"

            # One keyboard step on the block_q slider: 128 -> 256 (the slider's step is one lane width).
            handle = page.locator(".svg-block-q .noUi-handle")
            handle.focus()
            handle.press("ArrowRight")
            after_tiles = _expected_tiles(256, 128)
            _wait_for_redraw(page, after_tiles, before_src)
            after_src = image.get_attribute("src")
            readout = page.locator(".svg-block-q .widget-readout").inner_text().strip()
            stats_text = stats.inner_text()

            # The head-kind toggle: "sliding tiles" shows the cube and window sliders and the window's plan.
            cube_row = page.locator(".svg-cube-frames")
            cube_hidden = not cube_row.is_visible()
            page.locator(".svg-head-kind button", has_text="sliding tiles").click()
            cube_row.wait_for(state="visible")
            sliding_tiles = _expected_sliding_tiles(256, 128)
            _wait_for_redraw(page, sliding_tiles, after_src)
            sliding_text = stats.text_content()

            page.wait_for_timeout(500)  # let the new image paint before the screenshot
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "explorer-failure.png"), full_page=True)
            raise
        finally:
            context.close()

    assert after_src != before_src, "moving block_q did not change the tile map image"
    assert readout == "256", f"block_q slider reads {readout!r} after one ArrowRight from 128"
    assert before_tiles != after_tiles and after_tiles in stats_text and before_tiles not in stats_text
    assert cube_hidden, "the sliding-tile cube sliders showed before 'sliding tiles' was chosen"
    assert sliding_tiles in sliding_text and "2 x 4 x 16 = 128 tokens, 3 x 2 x 1 of them" in sliding_text
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 10_000
