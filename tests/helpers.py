"""What several test files share: masks built from plain arrays (`ArrayMask`, `tile_view`), inputs
(`random_qkv`), masks with empty rows and tiles (`HOLEY`, `EMPTY_TILE_ROW`), and the race detector of
the interpreter that simulates a TPU (`needs_race_state`, `races_found_in`). The float64 references
are the package's own (`svg_lib.extensions.references`)."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from svg_lib.core.masks import Mask, TileAlignedMask

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def on_tpu() -> bool:
    """Whether jax runs on a TPU here (the kernels then run compiled, not interpreted)."""
    return jax.devices()[0].platform == "tpu"


def method_tolerance(method, dtype, kind="attention"):
    """The tolerance for `method`'s results of `dtype` on this backend: Splash's float32 matmuls run
    one bf16 pass on a TPU (svg_lib/extensions/tolerances.py)."""
    from svg_lib.extensions.tolerances import tolerance
    from svg_lib.methods import METHODS
    splash = method in METHODS and METHODS[method].splash
    return tolerance(dtype, kind, one_bf16_pass=splash and on_tpu())


class ArrayMask(Mask):
    """Any dense pattern as a Mask; exercises the generic (brute-force) pair_counts."""

    def __init__(self, dense):
        self.dense = np.asarray(dense, dtype=bool)
        self.tokens = self.dense.shape[0]

    def keep(self, q, k):
        n = self.tokens
        inside = (q < n) & (k < n)
        if isinstance(q, np.ndarray) or isinstance(k, np.ndarray):
            return self.dense[np.minimum(q, n - 1), np.minimum(k, n - 1)] & inside
        return jnp.asarray(self.dense)[jnp.minimum(q, n - 1), jnp.minimum(k, n - 1)] & inside


def tile_view(dense, block_q, block_kv):
    """(counts, areas) [nq, nk] of the tile grid, from a dense mask padded with False."""
    n = dense.shape[0]
    nq, nk = -(-n // block_q), -(-n // block_kv)
    padded = np.zeros((nq * block_q, nk * block_kv), dtype=bool)
    padded[:n, :n] = dense
    counts = padded.reshape(nq, block_q, nk, block_kv).sum(axis=(1, 3))
    real = np.zeros_like(padded)
    real[:n, :n] = True
    areas = real.reshape(nq, block_q, nk, block_kv).sum(axis=(1, 3))
    return counts, areas


def random_qkv(seed, heads, tokens, head_dim, dtype, sharpness=2.0):
    """Gaussian q, k, v; q scaled by `sharpness` so each row's softmax is far from uniform
    (scores have a standard deviation of about `sharpness`), which makes masks matter."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, tokens, head_dim)) * sharpness
    k = rng.standard_normal((heads, tokens, head_dim))
    v = rng.standard_normal((heads, tokens, head_dim))
    return tuple(jnp.asarray(x, dtype=DTYPES[dtype]) for x in (q, k, v))


# -- rows and tiles with nothing kept ------------------------------------------------------

class HoleyBand(Mask):
    """A band of half-width `width` in which every query row q with q % 7 == 3 keeps nothing:
    empty rows inside visited, partially kept tiles. Pure arithmetic, so kernels can evaluate it."""

    def __init__(self, tokens, width):
        self.tokens, self.width = tokens, width

    def keep(self, q, k):
        n, w = self.tokens, self.width
        return (q - k <= w) & (k - q <= w) & (q % 7 != 3) & (q < n) & (k < n)


HOLEY = HoleyBand(400, 150)
# 600 tokens in 5x5 tiles of 128: query tile 1 keeps no tile at all, tile (3, 0) is dropped.
_KEPT = np.ones((5, 5), bool)
_KEPT[1, :] = False
_KEPT[3, 0] = False
EMPTY_TILE_ROW = TileAlignedMask(600, 128, 128, _KEPT)


# -- race detection ------------------------------------------------------------------------
# jax 0.10.2's TPU interpreter (jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py)
# keeps a module-level `races` (a RaceDetectionState) that each kernel run under
# InterpretParams(detect_races=True) recreates; its `races_found` turns True (and a
# "RACE DETECTED" report is printed) when two accesses to one buffer are not ordered.
# The module is private and older jax releases (0.7) keep it elsewhere; where it is
# missing the two race tests skip; the kernels' outputs are checked by every other test.
try:
    _interp = importlib.import_module("jax._src.pallas.mosaic.interpret.interpret_pallas_call")
except ImportError:
    _interp = None
needs_race_state = pytest.mark.skipif(
    _interp is None, reason=f"jax {jax.__version__} has no jax._src.pallas.mosaic.interpret."
                            "interpret_pallas_call (the race-detection state of the pinned jax 0.10.2)")


def races_found_in(run):
    """Run `run()` with a fresh interpreter state; (its result, whether a race was found)."""
    pltpu.reset_tpu_interpret_mode_state()
    out = run()  # its outputs are numpy arrays (or blocked on): the kernel has finished
    assert _interp.races is not None and _interp.races.reads, "the race detector recorded nothing"
    return out, bool(_interp.races.races_found)
