"""Where svg_lib keeps results that are slow to make (tuning runs, compiler verdicts, cost probes).

`$SVG_LIB_CACHE_DIR/<kind>`, else `$XDG_CACHE_HOME/svg_lib/<kind>` (`~/.cache/svg_lib/<kind>`
when XDG_CACHE_HOME is unset). Entries are JSON files named by a digest of their key, written
atomically, since two processes (test workers, two notebooks) may store the same entry at once.
Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

CACHE_ENV = "SVG_LIB_CACHE_DIR"


def cache_dir(kind: str) -> Path:
    """The folder for one kind of result ("tune", "cost")."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / kind
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "svg_lib" / kind


def key_digest(key: dict) -> str:
    """A file name for `key`: the first 24 hex digits of the SHA-256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def write_json_atomic(path: Path, data: dict) -> bool:
    """Write `data` to `path` so that a reader never sees half a file; False (and a note) on failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
        return True
    except OSError as err:  # a read-only home must not lose the result
        print(f"svg_lib: could not write the cache ({err}); results not cached", file=sys.stderr)
        return False
