"""Where svg_lib keeps results that are slow to make (tuning runs, compiler verdicts, cost probes).

`$SVG_LIB_CACHE_DIR/<kind>`, else `$XDG_CACHE_HOME/svg_lib/<kind>` (`~/.cache/svg_lib/<kind>`
when XDG_CACHE_HOME is unset). Entries are JSON files named by a digest of their key, written
atomically, since two processes (test workers, two notebooks) may store the same entry at once.
In memory, for this process only: the attention functions `attention(...)` and the routed layers
built (`cached_build`), keyed by a mask's value (`content_key` digests the tables a mask holds).
Standard library only at import (jax is imported when a function is built).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import OrderedDict
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


def content_key(array) -> tuple:
    """A value key for a NumPy table (a mask's table: `Mask.cache_key`): dtype, shape and a 128-bit
    digest of its bytes, in C order whatever the array's layout.

    A digest rather than the bytes themselves keeps keys small (a permutation of 75,600 tokens
    is 600 KB); hashing it costs about a millisecond, and is done each time a key is asked for.
    """
    return array.dtype.str, array.shape, hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest()


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


# -- in memory: built attention functions, kept for the next call with an equal mask -------------

_BUILT: OrderedDict = OrderedDict()
_BUILT_SIZE = 32


def cached_build(builder, mask, q, **config):
    """`builder(mask, heads=, tokens=, head_dim=, dtype=, **config)` for q's shape, built once and kept.

    A small LRU keyed by the builder, the mask's value (`mask_cache_key`), q's shape and dtype
    and `config`, so calling `attention(...)` again with an equal mask and the same shapes
    plans and traces once, even when the mask was built again (`preset.mask()` per call).
    """
    heads, tokens, head_dim = (int(s) for s in q.shape)
    key = (builder.__qualname__, mask_cache_key(mask), heads, tokens, head_dim, str(q.dtype),
           tuple(sorted((name, repr(value)) for name, value in config.items())))
    entry = _BUILT.get(key)
    if entry is None or (key[1][0] == "identity" and entry[0] is not mask):
        import jax

        # Called under jit or grad, the builder's constant arrays (schedule tables, masks) would
        # be tracers of that trace, and the cached function would leak them into later calls:
        # build them as concrete arrays instead.
        with jax.ensure_compile_time_eval():
            fn = builder(mask, heads=heads, tokens=tokens, head_dim=head_dim, dtype=q.dtype, **config)
        entry = (mask, fn)  # holding the mask keeps an identity key's id(mask) from being reused
        _BUILT[key] = entry
        while len(_BUILT) > _BUILT_SIZE:
            _BUILT.popitem(last=False)
    _BUILT.move_to_end(key)
    return entry[1]


def mask_cache_key(mask) -> tuple:
    """How `cached_build` tells masks apart: ("value", mask.cache_key()) for a mask that names its
    contents (every svg_lib mask), else ("identity", id(mask)) (a Mask subclass defined elsewhere,
    whose parameters svg_lib cannot know: it is reused only when passed again itself)."""
    key = None if mask is None else getattr(mask, "cache_key", lambda: None)()
    return ("value", key) if mask is None or key is not None else ("identity", id(mask))
