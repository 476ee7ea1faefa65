"""Progress of long work: one tqdm bar on stderr (tqdm's widget in a notebook), silenced at will.

The frontier, the tuner, the report, the compile tools and plans of a million tokens or more
take minutes; each shows a bar saying what it is doing now. `set_quiet()` (the command line's
`--quiet`) or the environment variable SVG_LIB_QUIET=1 silences every bar; results never depend
on them. Standard library only at import: tqdm is imported when a bar is made.
"""
from __future__ import annotations

import os
import sys

QUIET_ENV = "SVG_LIB_QUIET"
_state = {"quiet": False}


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) every progress bar of this process."""
    _state["quiet"] = bool(quiet)


def is_quiet() -> bool:
    """True when bars are silenced: by `set_quiet()` or by SVG_LIB_QUIET set to anything but "" or "0"."""
    return _state["quiet"] or os.environ.get(QUIET_ENV, "") not in ("", "0")


def bar(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "step", show: bool = True,
        delay: float = 1.0):
    """A tqdm bar over `iterable` (or over `total` steps, advanced by `.update(n)`), on stderr.

    `desc` says what runs; change it as the work moves on with `.set_description(...)`, and add
    the current item with `.set_postfix_str(...)`. With `show` False, or when quiet, the bar is
    tqdm's disabled one: the same methods, nothing printed. It is left on screen only while it
    runs (`leave=False`), so that what a command prints stays as it was, and appears only once the
    work has taken `delay` seconds (a plan of a million SVG tokens takes under one)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                disable=not show or is_quiet(), dynamic_ncols=True, delay=delay)


def write(line: str, file=None) -> None:
    """Print `line` (to stdout by default) without breaking a bar that is on screen: tqdm clears the
    bar, prints, and draws it again."""
    from tqdm.auto import tqdm

    tqdm.write(line, file=file or sys.stdout)
    (file or sys.stdout).flush()
