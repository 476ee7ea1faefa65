"""The bounded max (svg_lib.kernels.forward: `start_bound`, `check_bound`, `BOUND_SLACK`), exact on every input.

A query tile's first step subtracts each row's Cauchy-Schwarz bound |q_i| max|k| instead of a running
max: no row max and no rescale. If every row's sum of exp(s - bound) over that step's kept keys shows a
score within BOUND_SLACK of the bound, the tile's remaining steps do the same; otherwise the step is
undone and the tile runs the running max, that step included. The check is made per query tile at run time, so
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

from svg_lib import SVGMask, VideoGeometry, attention, b3_mask, build_attention
from svg_lib.kernels import forward
from svg_lib.instruments.adversarial import CASES, adversarial_heads, adversarial_qkv
from svg_lib.extensions.tolerances import tolerance
from helpers import HOLEY
from svg_lib.extensions.references import attention_float64

GEOMETRY = VideoGeometry(4, 8, 12, text_tokens=20)  # 404 tokens: q and kv padding at 128 x 128
MASK = SVGMask.spatial(GEOMETRY, 0.35)
METHODS = ("dense", "b1", "b2", "b3")
INTERPRETERS = {"plain": True, "tpu": "params"}  # "params": a fresh pltpu.InterpretParams() per run
# the parametrisation over both, the TPU interpreter's runs marked for the pinned stage (tests/conftest.py)
BOTH = [pytest.param(name, marks=pytest.mark.tpu_interpreter) if name == "tpu" else name for name in INTERPRETERS]


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
    original = forward.online_softmax_tile

    def counted(*args, bounded=False, **kwargs):
        jax.debug.callback(lambda: counts.update(["bounded" if bounded else "running"]))
        return original(*args, bounded=bounded, **kwargs)

    monkeypatch.setattr(forward, "online_softmax_tile", counted)
    return counts


@pytest.mark.parametrize("interp", BOTH)
@pytest.mark.parametrize("kind", ["ordinary", "wide", "late_large", "bf16_huge"])
@pytest.mark.parametrize("method", METHODS)
def test_matches_float64_on_inputs_that_break_a_fixed_max(method, kind, interp):
    qkv = _inputs(kind, MASK.tokens)
    mask = _mask_for(method, MASK)
    got = _run(method, MASK, qkv, _interpret(interp))
    want = attention_float64(*qkv, None if mask is None else mask.to_dense())
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


@pytest.mark.parametrize("interp", BOTH)
def test_ordinary_tiles_keep_the_bound_from_their_first_step_and_wide_ones_never(body_counts, interp):
    heads, query_tiles, kv_tiles = 2, 4, 4  # 404 tokens in tiles of 128
    _run("dense", None, _inputs("ordinary", MASK.tokens), _interpret(interp))
    # every query tile passes the check after its first step and runs every step on the bound
    assert body_counts == {"bounded": heads * query_tiles * kv_tiles}
    body_counts.clear()
    _run("dense", None, _inputs("wide", MASK.tokens), _interpret(interp))
    # every query tile fails it: its first step runs on the bound, is undone, then everything runs the running max
    assert body_counts == {"bounded": heads * query_tiles, "running": heads * query_tiles * kv_tiles}


def test_rows_with_no_kept_key_keep_the_running_max(monkeypatch):
    """HOLEY's every query tile holds rows that keep nothing: no tile may keep the bound, rows stay 0."""
    qkv = _inputs("ordinary", HOLEY.tokens)
    verdicts = _tiles_that_switched(monkeypatch)
    got = _run("b2", HOLEY, qkv, True)
    empty = ~HOLEY.to_dense().any(axis=1)
    assert (got[:, empty] == 0).all() and verdicts and not any(verdicts)
    np.testing.assert_allclose(got, attention_float64(*qkv, HOLEY.to_dense()), **tolerance("float32"))


@pytest.mark.parametrize("gap", [forward.BOUND_SLACK - 1.0, forward.BOUND_SLACK + 1.0])
@pytest.mark.parametrize("interp", BOTH)
def test_rows_at_the_edge_of_the_slack(monkeypatch, gap, interp):
    """Every row's scores are all equal to a, one extra key of norm R is orthogonal to every query,
    and |q| R / sqrt(D) - a = gap: at BOUND_SLACK - 1 the tiles keep the bound and exp(s - bound) is
    about exp(-59) for every term (127 of them in the first tile: l passes 128 exp(-BOUND_SLACK)); at
    BOUND_SLACK + 1 they must not. Both must give float64's answer."""
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
    verdicts = _tiles_that_switched(monkeypatch)
    got = _run("dense", None, qkv, _interpret(interp))
    np.testing.assert_allclose(got, attention_float64(*qkv), **tolerance("float32"))
    assert verdicts == [gap < forward.BOUND_SLACK] * 2, verdicts  # both query tiles


def _adversarial_heads(head_dim, dtype):
    """Every adversarial case as one head of a `[8, 256, head_dim]` problem (the bound is per head)."""
    return tuple(jnp.asarray(x, dtype) for x in adversarial_heads(head_dim))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scores_at_their_bound_stay_finite_and_exact(dtype, head_dim):
    """Scores of 1e7 to 1e9 at their bound: float32 rounding of the score and of the bound once made
    exp(s - bound) overflow (the whole query tile NaN, head_dim 64 and 256 at 1e9). With the bound's
    margin these tiles keep the running max and match float64 exactly."""
    q, k, v = _adversarial_heads(head_dim, dtype)
    got = _run("dense", None, (q, k, v), True)
    want = attention_float64(q, k, v)
    for h, case in enumerate(CASES):
        assert np.isfinite(got[h]).all(), case
        np.testing.assert_allclose(got[h], want[h], **tolerance(dtype), err_msg=f"{case}, {dtype}, {head_dim}")


@pytest.mark.parametrize("method", ["dense", "b3"])
@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.tpu_interpreter
def test_scores_at_their_bound_in_the_tpu_interpreter(method, head_dim):
    """The same inputs in the interpreter that runs the TPU's code path (float32, scores of 1e9)."""
    q, k, v = (jnp.asarray(x, jnp.float32) for x in adversarial_qkv("identical", head_dim, 1e9))
    geometry = VideoGeometry(2, 8, 16)  # 256 tokens
    mask = SVGMask.spatial(geometry, 0.35)
    got = _run(method, mask, (q, k, v), _interpret("tpu"))
    want = attention_float64(q, k, v, None if method == "dense" else b3_mask(mask, 128, 128).to_dense())
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, **tolerance("float32"))


@pytest.mark.parametrize("kind", ["identical", "parallel"])
def test_moderate_scores_at_their_bound_still_take_the_bound(body_counts, kind):
    """The margin costs nothing where scores are ordinary: at their bound with scores near 10, every
    query tile still keeps the bound from its first step."""
    q, k, v = (jnp.asarray(x, jnp.float32) for x in adversarial_qkv(kind, 128, 10.0))
    _run("dense", None, (q, k, v), True)
    assert body_counts == {"bounded": 4}  # 2 query tiles x 2 key tiles, all on the bound


def test_a_failing_tile_tests_the_bound_once(monkeypatch):
    """A query tile whose rows fail the bound's check keeps the running max without checking again:
    the check runs once per query tile, whatever the number of steps (4 query tiles x 4 key tiles)."""
    tries = collections.Counter()
    original = forward.check_bound

    def counted(*args, **kwargs):
        jax.debug.callback(lambda: tries.update(["try"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(forward, "check_bound", counted)
    _run("dense", None, _inputs("wide", MASK.tokens), True)
    assert tries["try"] == 2 * 4  # heads x query tiles


def test_gradients_at_the_bound_stay_finite():
    """jax.grad through the dense kernels (forward with the bound, fused backward) on the same heads."""
    q, k, v = _adversarial_heads(64, "float32")

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, None, method="dense", block_q=128, block_kv=128, interpret=True) * v)

    for name, g in zip("qkv", jax.grad(loss, argnums=(0, 1, 2))(q, k, v)):
        assert np.isfinite(np.asarray(g)).all(), f"d{name}"


def _tiles_that_switched(monkeypatch):
    """Records, at run time, each `check_bound` call's verdict (the flag it leaves) in call order."""
    verdicts = []
    original = forward.check_bound

    def recorded(m_ref, l_ref, acc_ref, flag_ref, **kwargs):
        original(m_ref, l_ref, acc_ref, flag_ref, **kwargs)
        jax.debug.callback(lambda f: verdicts.append(int(f) == forward.BOUNDED), flag_ref[0])

    monkeypatch.setattr(forward, "check_bound", recorded)
    return verdicts


@pytest.mark.parametrize("method", ["dense", "b2", "b3"])
def test_the_pass_rate_is_what_the_kernels_decide(monkeypatch, method):
    """`bound_pass_rate` (a float64 mirror of the kernels' test) against the verdicts the kernels
    reach, on heads where some query tiles pass and some fail (a few rows scaled far out)."""
    from svg_lib.layers.profiling import bound_pass_rate
    q, k, v = (np.asarray(x, np.float64) for x in _inputs("ordinary", MASK.tokens, heads=2))
    q[0, 130:140] *= 40.0   # query tile 1 of head 0: rows whose bound runs far above their max
    q[1, 300:310] *= 40.0   # query tile 2 of head 1
    verdicts = _tiles_that_switched(monkeypatch)
    mask = None if method == "dense" else MASK
    _run(method, MASK, tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v)), True)
    rate = bound_pass_rate(q, k, mask, method=method, block_q=128, block_kv=128)
    tiles = len(verdicts) // 2
    assert 0 < np.mean(verdicts) < 1
    np.testing.assert_allclose(rate, [np.mean(verdicts[:tiles]), np.mean(verdicts[tiles:])])


def test_the_pass_rate_on_the_device_decides_as_the_host_does():
    """bound_test's float32 path on jax's device (what the report takes on a TPU) against its float64 path
    on the host, on heads where some query tiles pass and some fail, with and without a mask's first tiles."""
    from svg_lib import EMPTY, plan_tiles
    from svg_lib.extensions.bounded_max import bound_test
    q, k, _ = (np.asarray(x, np.float64) for x in _inputs("ordinary", MASK.tokens, heads=2))
    q[0, 130:140] *= 40.0
    q[1, 300:310] *= 40.0
    plan = plan_tiles(MASK, 128, 128)
    first = plan.step_class[:, 0]
    masked = {"first_kv": plan.kv_index[:, 0], "keep": (MASK.kernel_predicate(128, 128), first != EMPTY)}
    for extra in ({}, masked):
        host = bound_test(q, k, block_q=128, block_kv=128, on_device=False, **extra)
        device = bound_test(q, k, block_q=128, block_kv=128, on_device=True, **extra)
        assert 0 < host.mean() < 1
        np.testing.assert_array_equal(device, host)
