"""The denoising proxy (svg_lib.layers.denoising) and plans reused across its steps
(svg_lib.layers.plan_reuse), at a small size: 4 frames of a crop of the committed clip, 768 tokens,
128-token tiles (6 x 6), 2 key tiles per query tile."""
import jax
import numpy as np
import pytest

from svg_lib.layers.clip_heads import clip_geometry, load_clip, patch_features
from svg_lib.layers.denoising import DenoisingProxy, flow_sigmas, noisy_latent
from svg_lib.layers.plan_reuse import (RefreshPolicy, amortized_plan_cycles, merge_plans, planner, reuse_run,
                                       tile_mean_drift, token_mean_drift)
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic import plan_recall

KINDS = ["content", "mixed", "spatial", "temporal"]
BLOCKS = dict(block_q=128, block_kv=128, density=0.34)


@pytest.fixture(scope="module")
def proxy():
    crop = load_clip()[:4, :32, :96]                      # 4 x 8 x 24 = 768 tokens
    return DenoisingProxy(patch_features(crop), clip_geometry(crop), KINDS, steps=12, head_dim=32)


@pytest.fixture(scope="module")
def plans():
    return planner(iterations=4, warm_iterations=2, **BLOCKS)


@pytest.fixture(scope="module")
def rows(proxy):
    return sample_rows(proxy.geometry.tokens, 96, 0)


# -- the schedule and the proxy -------------------------------------------------------------------

def test_the_shifted_rectified_flow_schedule():
    plain = flow_sigmas(4, 1.0)
    np.testing.assert_allclose(plain, [1.0, 0.75, 0.5, 0.25])       # no shift: evenly spaced from pure noise
    shifted = flow_sigmas(40, 5.0)
    assert shifted[0] == 1.0 and np.all(np.diff(shifted) < 0) and 0 < shifted[-1] < 0.2
    assert np.all(shifted[1:] > flow_sigmas(40, 1.0)[1:])            # a shift > 1 spends more steps at high noise
    s = 0.5
    assert flow_sigmas(2, 5.0)[1] == pytest.approx(5 * s / (1 + 4 * s))
    for bad in (dict(steps=0), dict(steps=2.5), dict(shift=0.0), dict(shift=True)):
        with pytest.raises(ValueError, match="steps|shift"):
            flow_sigmas(**{"steps": 4, "shift": 1.0, **bad})


def test_the_latent_runs_from_noise_to_the_clip_at_unit_variance():
    rng = np.random.default_rng(0)
    x0, eps = rng.standard_normal((2, 5000, 6))
    np.testing.assert_array_equal(noisy_latent(x0, eps, 1.0), eps)
    np.testing.assert_array_equal(noisy_latent(x0, eps, 0.0), x0)
    assert noisy_latent(x0, eps, 0.5).std() == pytest.approx(1.0, abs=0.03)


def test_the_proxy_is_deterministic_and_moves_with_the_latent(proxy):
    assert proxy.steps == 12 and len(list(proxy)) == 12
    q0, k0 = proxy.qk(5)
    assert q0.shape == (4, 768, 32) and q0.dtype == np.float32 and np.isfinite(np.asarray(q0)).all()
    q1, _ = proxy.qk(5)
    np.testing.assert_array_equal(np.asarray(q0), np.asarray(q1))
    # consecutive steps differ by more as the noise falls (the shift packs the early steps at high noise)
    qa, qb, qc, qd = (np.asarray(proxy.qk(s)[0]) for s in (1, 2, 10, 11))
    assert np.abs(qd - qc).mean() > 3 * np.abs(qb - qa).mean() > 0
    with pytest.raises(ValueError, match="step must be an integer in"):
        proxy.qk(12)


def test_position_heads_keep_their_code_only_the_latent_part_moves(proxy):
    still = DenoisingProxy(proxy.x0, proxy.geometry, KINDS, steps=12, head_dim=32, noise=0.0)
    qa, qb = (np.asarray(still.qk(s)[0]) for s in (0, 11))
    np.testing.assert_array_equal(qa[2:], qb[2:])                   # spatial, temporal: position only
    assert not np.allclose(qa[:2], qb[:2])                          # content, mixed: the latent's code


def look_alike(q, k, x0, rows):
    """The mean appearance distance (in `x0`) from a query to the keys it attends, the query itself
    left out, over the mean distance: 1 for attention blind to appearance, lower when it follows it."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    s = q[rows] @ k.T / np.sqrt(q.shape[1])
    s[np.arange(len(rows)), rows] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dist = np.linalg.norm(x0[rows][:, None] - x0[None], axis=-1)
    return (p * dist).sum(axis=1).mean() / dist.mean()


def test_the_content_head_finds_the_picture_as_the_noise_falls(proxy):
    rows = np.arange(0, 768, 8)
    look = {step: look_alike(*(a[0] for a in proxy.qk(step)), proxy.x0, rows) for step in (0, 6, 11)}
    assert look[0] > 0.95                      # pure noise: blind to the clip
    assert look[11] < 0.8 * look[6] < look[0]  # the least noisy step: look-alike patches


# -- drift statistics -------------------------------------------------------------------------------

def test_drift_is_zero_for_identical_inputs_and_grows_with_the_change(proxy, plans):
    q, k = proxy.qk(8)
    plan = plans[0](q, k)
    np.testing.assert_array_equal(token_mean_drift(q, k, q, k), 0.0)
    assert np.abs(tile_mean_drift(plan, q, k)).max() < 1e-5     # a fresh plan's centroids are its tiles' means
    noise = jax.random.normal(jax.random.key(0), q.shape) + 0.1   # a change with a mean: both statistics see it
    tok = [token_mean_drift(q, k, q + c * noise, k + c * noise) for c in (0.1, 0.4, 1.6)]
    til = [tile_mean_drift(plan, q + c * noise, k + c * noise) for c in (0.1, 0.4, 1.6)]
    for seq in (tok, til):
        assert np.all(seq[0] > 0) and np.all(seq[1] > seq[0]) and np.all(seq[2] > seq[1])
    np.testing.assert_allclose(tok[1], 4 * tok[0], rtol=1e-3)    # the token-mean's drift is linear in the change
    # a zero-mean change per tile of tokens is invisible to the token-mean, not to the tile means
    flip = np.asarray(q).copy()
    flip[:, ::2], flip[:, 1::2] = np.asarray(q)[:, 1::2], np.asarray(q)[:, ::2]   # swap neighbours' q
    assert token_mean_drift(q, k, flip, k).max() < 1e-6 < tile_mean_drift(plan, flip, k).min()


# -- refresh policies ---------------------------------------------------------------------------------

def test_the_policy_refreshes_when_it_should():
    age, drift = np.array([0, 1, 3, 4, 9]), np.array([0.5, 0.0, 0.2, 0.0, 0.0])
    assert RefreshPolicy(every=4).refresh(age, drift).tolist() == [False, False, False, True, True]
    assert RefreshPolicy(threshold=0.1).refresh(age, drift).tolist() == [True, False, True, False, False]
    assert RefreshPolicy(every=4, threshold=0.1).refresh(age, drift).tolist() == [True, False, True, True, True]
    assert not RefreshPolicy().refresh(age, drift).any()
    assert RefreshPolicy(every=8, threshold=0.05, statistic="tile_mean").name == "every 8 or tile_mean drift > 0.05"
    for bad in (dict(every=0), dict(every=1.5), dict(threshold=-1), dict(statistic="l2")):
        with pytest.raises(ValueError, match="every|threshold|statistic"):
            RefreshPolicy(**bad)


def test_a_reused_plan_at_age_0_is_the_fresh_plan_and_merging_picks_heads(proxy, plans):
    cold, warm = plans
    qa, ka = proxy.qk(6)
    qb, kb = proxy.qk(11)
    a, b = cold(qa, ka), warm(qb, kb, cold(qa, ka).centroids)
    same = merge_plans(a, b, [False] * 4)
    for x, y in zip(jax.tree.leaves(same), jax.tree.leaves(a)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    mixed = merge_plans(a, b, [True, False, True, False])
    np.testing.assert_array_equal(np.asarray(mixed.tiles[0]), np.asarray(b.tiles[0]))
    np.testing.assert_array_equal(np.asarray(mixed.q_order[1]), np.asarray(a.q_order[1]))
    np.testing.assert_array_equal(np.asarray(mixed.centroids.k[2]), np.asarray(b.centroids.k[2]))


def test_a_run_refreshes_on_schedule_and_matches_plans_made_by_hand(proxy, plans, rows):
    cold, warm = plans
    steps = [proxy.qk(s) for s in range(6, 12)]
    run = reuse_run(steps, RefreshPolicy(every=2), rows, plans=plans, **BLOCKS)
    assert run["refreshed"].tolist() == [[True] * 4, [False] * 4, [True] * 4, [False] * 4, [True] * 4, [False] * 4]
    assert run["refreshes"].tolist() == [3] * 4 and run["age"][:, 0].tolist() == [0, 1, 0, 1, 0, 1]
    # by hand: cold at the first step, used at the second, warm from it at the third, ...
    plan = cold(*steps[0])
    want = [plan_recall(*steps[0], plan, rows), plan_recall(*steps[1], plan, rows)]
    plan = warm(*steps[2], plan.centroids)
    want += [plan_recall(*steps[2], plan, rows), plan_recall(*steps[3], plan, rows)]
    np.testing.assert_allclose(run["recall"][:4], np.asarray(want), rtol=1e-6)
    # never refreshing: the first plan throughout; identical steps: no drift, recall constant
    frozen = reuse_run([steps[0]] * 3, RefreshPolicy(threshold=0.0), rows, plans=plans, **BLOCKS)
    assert frozen["refreshes"].tolist() == [1] * 4 and np.all(frozen["drift"] == 0)
    np.testing.assert_allclose(frozen["recall"], np.repeat(frozen["recall"][:1], 3, axis=0))


def test_a_drift_policy_refreshes_the_heads_that_moved(proxy, plans, rows):
    steps = [proxy.qk(s) for s in range(8, 12)]
    run = reuse_run(steps, RefreshPolicy(threshold=0.02), rows, plans=plans, **BLOCKS)
    moved = token_mean_drift(*steps[0], *steps[1]) > 0.02
    assert run["refreshed"][1].tolist() == moved.tolist()
    # the position heads' token-means do not move (their change is zero-mean): they never refresh
    assert run["refreshes"][2:].tolist() == [1, 1] and run["refreshes"][:2].max() > 1


def test_amortized_plan_cycles():
    np.testing.assert_allclose(amortized_plan_cycles(1e6, [1, 5, 40], 40), [25_000, 125_000, 1e6])
    with pytest.raises(ValueError, match="steps"):
        amortized_plan_cycles(1e6, [1], 0)


def test_bad_input_is_refused_before_any_work(proxy, plans):
    with pytest.raises(ValueError, match="features must be"):
        DenoisingProxy(proxy.x0[:-1], proxy.geometry, KINDS)
    with pytest.raises(ValueError, match="heads_kinds"):
        DenoisingProxy(proxy.x0, proxy.geometry, ["content", "diagonal"])
    q, k = proxy.qk(3)
    with pytest.raises(ValueError, match="like q_anchor"):
        token_mean_drift(q, k, q[:2], k)
    with pytest.raises(ValueError, match="heads x tokens"):
        tile_mean_drift(plans[0](q, k), q[:, :640], k[:, :640])
