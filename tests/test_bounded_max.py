"""The bounded max (svg_lib.kernels.forward: `_try_bound`, `BOUND_SLACK`), exact on every input.

Once every row of a query tile has seen a kept key whose score lies within BOUND_SLACK of its
Cauchy-Schwarz bound |q_i| max|k|, the tile's remaining steps subtract that bound instead of a
running max: no row max and no rescale. The switch is decided per query tile at run time, so
these tests check both what the kernels compute (against float64, on inputs built to break a
fixed max: scores spanning hundreds of units, a late run of large keys, rows with no kept key,
bf16 inputs far beyond exp's range, rows sitting at the edge of the slack) and which path ran
(a run-time count of the bodies each kernel executed), in the plain interpreter and in the
interpreter that simulates a TPU (`pltpu.InterpretParams`), which runs the TPU's code path.
"""
import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from svg_lib import SVGMask, VideoGeometry, b3_mask, build_attention
from svg_lib.kernels import forward
from svg_lib.kernels.tolerances import tolerance
from test_kernels import HOLEY, attention64

GEOMETRY = VideoGeometry(4, 8, 12, text_tokens=20)  # 404 tokens: q and kv padding at 128 x 128
MASK = SVGMask.spatial(GEOMETRY, 0.35)
METHODS = ("dense", "b1", "b2", "b3")
INTERPRETERS = {"plain": True, "tpu": "params"}  # "params": a fresh pltpu.InterpretParams() per run


def _interpret(name):
    return pltpu.InterpretParams() if INTERPRETERS[name] == "params" else True


def _inputs(kind, tokens, heads=2, head_dim=64, seed=0):
    """q, k, v `[heads, tokens, head_dim]` built to stress a fixed max (see the module docstring)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, tokens, head_dim)) for _ in range(3))
    dtype = jnp.float32
    if kind == "wide":            # scores with a spread of ~60: rows span hundreds of units
        q *= 60.0
    elif kind == "late_large":    # the last keys dominate max|k| and, for many rows, the row max
        k[:, -40:] *= 12.0
    elif kind == "bf16_huge":     # bf16 scores of thousands: exp of any unshifted score overflows
        q, k, dtype = q * 40.0, k * 8.0, jnp.bfloat16
    elif kind != "ordinary":
        raise ValueError(kind)
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _mask_for(method, mask):
    if method == "dense":
        return None
    return b3_mask(mask, 128, 128) if method == "b3" else mask


def _run(method, mask, qkv, interpret):
    heads, tokens, head_dim = qkv[0].shape
    f = build_attention(mask, method=method, heads=heads, tokens=tokens, head_dim=head_dim, dtype=qkv[0].dtype,
                        block_q=128, block_kv=128, interpret=interpret)
    return np.asarray(jnp.asarray(f(*qkv), jnp.float32), np.float64)


@pytest.fixture
def body_counts(monkeypatch):
    """Counts, at run time, the tile bodies the kernels execute: {"bounded": n, "running": n}."""
    counts = collections.Counter()
    original = forward._online_softmax_tile

    def counted(*args, bounded=False, **kwargs):
        jax.debug.callback(lambda: counts.update(["bounded" if bounded else "running"]))
        return original(*args, bounded=bounded, **kwargs)

    monkeypatch.setattr(forward, "_online_softmax_tile", counted)
    return counts


@pytest.mark.parametrize("interp", list(INTERPRETERS))
@pytest.mark.parametrize("kind", ["ordinary", "wide", "late_large", "bf16_huge"])
@pytest.mark.parametrize("method", METHODS)
def test_matches_float64_on_inputs_that_break_a_fixed_max(method, kind, interp):
    qkv = _inputs(kind, MASK.tokens)
    mask = _mask_for(method, MASK)
    got = _run(method, MASK, qkv, _interpret(interp))
    want = attention64(*qkv, None if mask is None else mask.to_dense())
    np.testing.assert_allclose(got, want, **_tolerance(qkv), err_msg=f"{method}, {kind}, {interp}")


def _tolerance(qkv):
    """The dtype's tolerance, widened for float32 by what float32 itself does to large scores.

    A float32 score of size |s| carries a rounding error of about sqrt(head_dim) ulps of |s| (its
    dot product's sum), in the kernel and in any float32 reference alike; the output moves by up
    to twice that times max|v|. Below |s| ~ 10 this is under the float32 tolerance; at the "wide"
    inputs' |s| ~ 250 it is ~5e-4 (the kernels' measured worst element: ~9e-5). bf16 inputs give
    exact products, accumulated in float32: the same term, far below bf16's tolerance."""
    tol = tolerance(qkv[0].dtype)
    q, k, v = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in qkv)
    head_dim = q.shape[-1]
    max_score = np.abs(np.einsum("hqd,hkd->hqk", q, k)).max() / math.sqrt(head_dim)
    rounding = 2 * math.sqrt(head_dim) * 2.0 ** -24 * max_score * np.abs(v).max()
    return dict(rtol=tol["rtol"], atol=tol["atol"] + rounding)


@pytest.mark.parametrize("interp", list(INTERPRETERS))
def test_ordinary_tiles_switch_after_their_first_step_and_wide_ones_never(body_counts, interp):
    heads, query_tiles, kv_tiles = 2, 4, 4  # 404 tokens in tiles of 128
    _run("dense", None, _inputs("ordinary", MASK.tokens), _interpret(interp))
    # every query tile runs one running-max step, then switches to the bound for the other three
    assert body_counts == {"running": heads * query_tiles, "bounded": heads * query_tiles * (kv_tiles - 1)}
    body_counts.clear()
    _run("dense", None, _inputs("wide", MASK.tokens), _interpret(interp))
    assert body_counts == {"running": heads * query_tiles * kv_tiles}


def test_rows_with_no_kept_key_keep_the_running_max(body_counts):
    """HOLEY's every query tile holds rows that keep nothing: no tile may switch, rows stay 0."""
    qkv = _inputs("ordinary", HOLEY.tokens)
    got = _run("b2", HOLEY, qkv, True)
    empty = ~HOLEY.to_dense().any(axis=1)
    assert (got[:, empty] == 0).all() and body_counts["bounded"] == 0 and body_counts["running"] > 0
    np.testing.assert_allclose(got, attention64(*qkv, HOLEY.to_dense()), **tolerance("float32"))


@pytest.mark.parametrize("gap", [forward.BOUND_SLACK - 1.0, forward.BOUND_SLACK + 1.0])
@pytest.mark.parametrize("interp", list(INTERPRETERS))
def test_rows_at_the_edge_of_the_slack(body_counts, gap, interp):
    """Every row's scores are all equal to a, one extra key of norm R is orthogonal to every query,
    and |q| R / sqrt(D) - a = gap: at BOUND_SLACK - 1 the tiles switch and exp(s - bound) is about
    exp(-59) for every term; at BOUND_SLACK + 1 they must not. Both must give float64's answer."""
    heads, tokens, head_dim = 1, 256, 64
    rng = np.random.default_rng(4)
    scale = 1 / math.sqrt(head_dim)
    c, a = 4.0, 2.0                                          # |q_i| = c, every score a
    q = np.zeros((heads, tokens, head_dim)); q[..., 0] = c
    k = np.zeros((heads, tokens, head_dim)); k[..., 0] = a / (c * scale)
    k[..., 1] = rng.uniform(-0.5, 0.5, (heads, tokens))      # norms differ a little; scores do not
    radius = (gap + a) / (c * scale)                         # the orthogonal key sets max|k|
    k[:, 7, :] = 0.0; k[:, 7, 2] = radius
    v = rng.standard_normal((heads, tokens, head_dim))
    qkv = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v))
    got = _run("dense", None, qkv, _interpret(interp))
    np.testing.assert_allclose(got, attention64(*qkv), **tolerance("float32"))
    switched = body_counts["bounded"] > 0
    assert switched == (gap < forward.BOUND_SLACK), dict(body_counts)
