"""E1, the online-softmax tile body: `check_tile_body` and its hidden cases.

The reference is svg_lib's `masked_softmax_times_v` over the kept keys, and the state (m, l, acc)
after every tile computed from its definitions in float64."""
from __future__ import annotations

import math

import numpy as np

from svg_lib.kernels.reference import masked_softmax_times_v
from svg_lib.extensions.tolerances import one_bf16_pass_slack, tolerance
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt


def _bf16_exact(x):
    """float32 `x` rounded to the nearest bf16 values (still float32).

    A learner's float32 matmul runs at its backend's default precision: one bf16 pass of the MXU on
    a TPU, which rounds both operands to bf16. On operands that are bf16 values already that pass is
    exact, so `q @ k.T` is the same on every backend: the hidden q, k and v are such values. (Scores
    in the hundreds, rounded to bf16, would move by ~0.5 and exp(score - m) by a factor of e^0.5.)
    Only the learner's `p @ v` is left to round (p is its own), which `_acc_slack` admits.
    """
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _tile_body_cases(seed: int) -> list[_Case]:
    rng = np.random.default_rng(seed)
    f32 = np.float32

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(f32)

    def case(name, q, tiles, focus=""):
        tiles = [(_bf16_exact(k), _bf16_exact(v), keep) for k, v, keep in tiles]
        return _Case(name, dict(q=_bf16_exact(q), tiles=tiles, focus=focus))

    # Few distinct shapes: jax compiles every eager operation once per shape, and this keeps the check fast.
    B, K, D = 5, 8, 8
    cases = [case("one tile of 5 queries x 8 keys, nothing masked", normal(B, D), [(normal(K, D), normal(K, D), None)])]

    qp = np.abs(normal(B, D)) + f32(0.1)
    rising = [(((np.abs(normal(K, D)) + f32(0.1)) * f32(1 + 2 * t)), normal(K, D), None) for t in range(3)]
    cases.append(case("three tiles, nothing masked, each tile raising every row's maximum", qp, rising))

    keep = rng.random((B, K)) < 0.5
    keep[np.arange(B), rng.integers(0, K, B)] = True
    cases.append(case("one tile with about half of its pairs masked", normal(B, D), [(normal(K, D), normal(K, D), keep)]))

    first = rng.random((B, K)) < 0.6
    first[:2] = False  # rows 0 and 1 see no kept key in the first tile
    cases.append(case("two tiles; rows 0 and 1 keep no key of the first tile", normal(B, D),
                      [(normal(K, D), normal(K, D), first), (normal(K, D), normal(K, D), np.ones((B, K), bool))]))

    never = np.ones((B, K), bool)
    never[3] = False
    cases.append(case("two tiles; row 3 keeps no key in either (its state must stay m = -inf, l = 0, acc = 0)",
                      normal(B, D), [(normal(K, D), normal(K, D), never), (normal(K, D), normal(K, D), never.copy())]))

    cases.append(case("scores in the hundreds (exp of a raw score overflows float32)", normal(B, D, scale=8.0),
                      [(normal(K, D, scale=8.0), normal(K, D), None), (normal(K, D, scale=8.0), normal(K, D), None)],
                      focus="overflow"))

    k_last, v_last = normal(K, D), normal(K, D)
    k_last[5:] = 50.0  # key padding: huge garbage scores that must never count
    v_last[5:] = 1e3
    pad_keep = np.ones((B, K), bool)
    pad_keep[:, 5:] = False
    cases.append(case("the last tile reaches into key padding (3 padded keys, masked, holding large garbage)",
                      normal(B, D), [(normal(K, D), normal(K, D), None), (k_last, v_last, pad_keep)]))

    cases.append(case("a fully masked tile between two ordinary ones (it must change nothing)", normal(B, D),
                      [(normal(K, D), normal(K, D), None), (normal(K, D, scale=3.0), normal(K, D), np.zeros((B, K), bool)),
                       (normal(K, D), normal(K, D), None)]))

    for r in range(6):
        bq, bkv, d = (B, K, D) if r < 4 else (2, 16, 4)
        n_tiles = int(rng.integers(1, 5))
        q = normal(bq, d, scale=float(rng.choice([0.5, 1.0, 3.0])))
        tiles = []
        for _ in range(n_tiles):
            keep = None if rng.random() < 0.3 else rng.random((bq, bkv)) < rng.uniform(0.1, 0.9)
            tiles.append((normal(bkv, d), normal(bkv, d), keep))
        cases.append(case(f"random: {bq} queries, {n_tiles} tile(s) of {bkv} keys, head_dim {d}", q, tiles))
    return cases


def _state_reference(q, tiles):
    """(m, l, acc) in float64 after folding `tiles` from the initial state, from the definitions.

    m = largest kept score per row (-inf if none), l = sum of exp(score - m) over kept keys,
    acc = sum of exp(score - m) * v over kept keys.
    """
    q = q.astype(np.float64)
    s = np.concatenate([q @ k.astype(np.float64).T for k, _, _ in tiles], axis=1)
    v = np.concatenate([v.astype(np.float64) for _, v, _ in tiles], axis=0)
    keep = np.concatenate([np.ones((q.shape[0], k.shape[0]), bool) if kp is None else kp for k, _, kp in tiles], axis=1)
    masked = np.where(keep, s, -np.inf)
    m = masked.max(axis=1)
    shift = np.where(np.isfinite(m), m, 0.0)
    p = np.where(keep, np.exp(masked - shift[:, None]), 0.0)
    return m, p.sum(axis=1), p @ v, s, keep, v, _acc_slack(p, v)


def _acc_slack(p, v):
    """What one bf16 pass of the learner's `p @ v` matmuls may move acc by, per element (see `_bf16_exact`).

    acc is rescaled sums of p @ v, tile by tile; measured against the final max, every term is
    bounded by |p| @ |v| over all the tiles folded so far, whichever tile's pass rounded it.
    """
    return one_bf16_pass_slack(np.abs(p), np.abs(v))


def _unpack_state(out, bq, d):
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise _Fail(f"tile_body returned {type(out).__name__}"
                    f"{' of length ' + str(len(out)) if isinstance(out, (tuple, list)) else ''}, expected a tuple (m, l, acc)",
                    "return the three updated arrays: `return m_next, l_next, acc_next`")
    arrays = []
    for name, value, shape in zip(("m", "l", "acc"), out, ((bq,), (bq,), (bq, d))):
        a = np.asarray(value, dtype=np.float64)
        if a.shape != shape:
            raise _Fail(f"the returned {name} has shape {a.shape}, expected {shape}",
                        "m and l hold one number per query row, acc one row of head_dim values per query row; "
                        "reduce over the key axis (axis=1) of the [bq, bkv] scores")
        arrays.append(a)
    return arrays


def _within(got, want, slack=0.0):
    """Elementwise: `got` agrees with `want` to the learner's float32 tolerance (atol scaled by the
    largest |want|), plus `slack` (per element: one bf16 pass of the learner's matmuls, for acc)."""
    tol = tolerance("float32", "learner")
    finite = np.abs(want[np.isfinite(want)])
    atol = tol["atol"] * max(1.0, float(finite.max(initial=0.0))) + slack
    return np.isclose(got, want, rtol=tol["rtol"], atol=atol)


def _close(got, want, slack=0.0):
    return bool(np.all(_within(got, want, slack)))


def _fold64(prev, q, k, v, keep, *, rescale=True, masked=-np.inf, scale=1.0, subtract_max=True):
    """One fold of a tile into `prev` = (m, l, acc) in float64, with a switch per typical mistake."""
    m_prev, l_prev, acc_prev = prev
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    if keep is not None:
        s = np.where(keep, s, masked)
    m = np.maximum(m_prev, s.max(axis=1))
    shift = np.where(np.isfinite(m), m, 0.0) if subtract_max else np.zeros_like(m)
    p = np.exp(s - shift[:, None])
    alpha = np.exp(np.where(np.isfinite(m_prev), m_prev, -np.inf) - shift) if rescale and subtract_max \
        else np.ones_like(shift)
    return m, alpha * l_prev + p.sum(axis=1), alpha[:, None] * acc_prev + p @ v.astype(np.float64)


def _tile_body_hint(got, want, prev, q, tile, acc_slack=0.0):
    """(quantity, hint) for the first of m, l, acc that is wrong, naming the mistake it matches.

    `acc_slack`: per element, what one bf16 pass of the learner's p @ v may move acc by (`_acc_slack`)."""
    k, v, keep = tile
    d = q.shape[1]
    variants = {
        "norescale": _fold64(prev, q, k, v, keep, rescale=False),
        "masked0": _fold64(prev, q, k, v, keep, masked=0.0),
        "nokeep": _fold64(prev, q, k, v, None),
        "scaled": _fold64(prev, q, k, v, keep, scale=1 / math.sqrt(d)),
        "nomax": _fold64(prev, q, k, v, keep, subtract_max=False),
    }
    masked = keep is not None and not np.all(keep)
    rose = bool(np.any(want[0] > prev[0]) and np.any(prev[1] > 0))
    hints = {
        "masked0": ("masked pairs contribute: a masked pair must add exactly nothing, and a score of 0 is not "
                    "nothing (exp(0 - m) > 0, and 0 can be the row's max); give masked scores -inf"),
        "nokeep": "masked pairs were counted: apply keep to the scores before the max and the sums",
        "scaled": ("your scores are divided by sqrt(head_dim), but q comes pre-scaled: the scores are exactly "
                   "q @ k.T"),
    }
    for index, name in enumerate(("m", "l", "acc")):
        slack = acc_slack if name == "acc" else 0.0
        if _close(got[index], want[index], slack):
            continue
        for variant in ("masked0", "nokeep") if masked else ():
            if _close(got[index], variants[variant][index], slack):
                return name, hints[variant]
        if _close(got[index], variants["scaled"][index], slack):
            return name, hints["scaled"]
        if name != "m" and _close(got[index], variants["nomax"][index], slack):
            return name, (f"{name} matches sums of exp(score) with no max subtracted: {name} is defined against the "
                          "running max m (exp(score - m)), which is also what keeps exp from overflowing")
        if name == "m":
            tile_only = (q.astype(np.float64) @ k.astype(np.float64).T)
            if keep is not None:
                tile_only = np.where(keep, tile_only, -np.inf)
            if _close(got[0], tile_only.max(axis=1)):
                return name, "m is only this tile's maximum: it must be the maximum over every tile seen so far"
            return name, "m must be the largest kept score seen so far in each row (-inf while none is kept)"
        if rose and _close(got[index], variants["norescale"][index], slack):
            return name, (f"{name} was not rescaled: when a row's max rises from m_prev to m_next, what {name} holds "
                          "was measured against m_prev and must be multiplied by exp(m_prev - m_next) before this "
                          "tile is added")
        per_l = np.where(want[1] > 0, want[1], 1.0)[:, None]
        if name == "acc" and _close(got[2], want[2] / per_l, slack / per_l):
            return name, ("acc is normalised: keep it unnormalised (a running sum of p @ v); the division by l "
                          "happens once, after the last tile")
        if name == "l":
            return name, "l must be the sum of exp(score - m) over the kept keys seen so far, with m the running max"
        return name, ("acc must be the sum of exp(score - m) * v over the kept keys seen so far, not yet divided "
                      "by l")
    return "", ""


def check_tile_body(fn, *, seed: int = 0) -> CheckResult:
    """E1: `fn(q, k, v, m, l, acc, keep) -> (m, l, acc)` folds one key/value tile into a query tile's state.

    q `[bq, d]` (pre-scaled), k and v `[bkv, d]`, m and l `[bq]` float32, acc `[bq, d]` float32,
    keep None or bool `[bq, bkv]`. Each case starts at m = -inf, l = 0, acc = 0, folds its tiles in
    turn, checks the state after every tile (no NaN; rows with no kept key stay at -inf, 0, 0), and
    after the last tile compares acc / l with svg_lib's softmax over the kept keys.
    """
    import jax.numpy as jnp

    def run(case):
        q, tiles = case.data["q"], case.data["tiles"]
        bq, d = q.shape
        m = jnp.full((bq,), -jnp.inf, jnp.float32)
        l = jnp.zeros((bq,), jnp.float32)
        acc = jnp.zeros((bq, d), jnp.float32)
        prev = (np.full(bq, -np.inf), np.zeros(bq), np.zeros((bq, d)))
        for t in range(len(tiles)):
            k, v, keep = tiles[t]
            out = _call(fn, "tile_body", jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), m, l, acc,
                        None if keep is None else jnp.asarray(keep))
            got = _unpack_state(out, bq, d)
            where = f"after tile {t + 1} of {len(tiles)}"
            m_ref, l_ref, acc_ref, s, keep_all, v_all, acc_slack = _state_reference(q, tiles[:t + 1])
            empty = ~np.isfinite(m_ref)
            for name, a in zip(("m", "l", "acc"), got):
                bad = np.isnan(a) if a.ndim == 1 else np.isnan(a).any(axis=1)
                if bad.any():
                    row = int(np.flatnonzero(bad)[0])
                    if empty[row]:
                        hint = ("row {r} has kept no key yet, so m_prev and m_next are both -inf and "
                                "exp(m_prev - m_next) = exp(-inf - (-inf)) = nan; while a row's max is still -inf, "
                                "what you subtract inside exp must be some finite number instead").format(r=row)
                    elif case.data["focus"] == "overflow":
                        hint = "exp of a score in the hundreds is inf in float32: subtract the running max m_next before exp"
                    else:
                        hint = "look for inf - inf or 0 * inf in your update"
                    raise _Fail(f"{where}: {name} has NaN in row {row} (got {name} = {_fmt(a[row])})", hint)
            for name, a in zip(("l", "acc"), got[1:]):
                if not np.all(np.isfinite(a)):
                    row = int(np.flatnonzero(~np.isfinite(a) if a.ndim == 1 else ~np.isfinite(a).all(axis=1))[0])
                    raise _Fail(f"{where}: {name} is infinite in row {row}",
                                "exp of a large score overflows float32: subtract the running max m_next before exp")
            if empty.any():
                r = int(np.flatnonzero(empty)[0])
                if not (got[0][r] == -np.inf and got[1][r] == 0 and np.all(got[2][r] == 0)):
                    raise _Fail(f"{where}: row {r} has kept no key yet; expected m = -inf, l = 0, acc = 0, got "
                                f"m = {_fmt(got[0][r])}, l = {_fmt(got[1][r])}, acc = {_fmt(got[2][r])}",
                                "a row that has seen only masked keys must stay in the initial state: masked keys "
                                "add nothing to l or acc, and its m stays -inf")
            which, hint = _tile_body_hint(got, (m_ref, l_ref, acc_ref), prev, q, tiles[t], acc_slack)
            if which:
                want = {"m": m_ref, "l": l_ref, "acc": acc_ref}[which]
                have = dict(zip(("m", "l", "acc"), got))[which]
                bad_rows = ~_within(have, want, acc_slack if which == "acc" else 0.0)
                row = int(np.flatnonzero(bad_rows if bad_rows.ndim == 1 else bad_rows.any(axis=1))[0])
                raise _Fail(f"{where}: row {row} expected {which} = {_fmt(want[row])}, got {_fmt(have[row])}", hint)
            prev = (m_ref, l_ref, acc_ref)
            m, l, acc = (jnp.asarray(a, jnp.float32) for a in got)
        # the contract's end point, against svg_lib's own masked softmax
        kept_rows = np.isfinite(prev[0])
        out = np.asarray(masked_softmax_times_v(jnp.asarray(s[None], jnp.float32), jnp.asarray(keep_all),
                                                jnp.asarray(v_all[None], jnp.float32)))[0]
        l_kept = np.asarray(l, np.float64)[kept_rows, None]
        final = np.asarray(acc, np.float64)[kept_rows] / l_kept
        if not _close(final, out[kept_rows], acc_slack[kept_rows] / l_kept):
            raise _Fail("after the last tile, acc / l differs from softmax attention over the kept keys",
                        "the state matches the definitions tile by tile, so look at dtypes: compute in float32")

    return _finish("E1 tile_body", _tile_body_cases(seed), run,
                   "rescaling when the max rises, masked and fully masked tiles, rows with no kept key, "
                   "large scores, key padding, random tiles")
