"""Checkers for the workshop's exercise notebooks (`notebooks/exercises/E1` ... `E7`).

Each `check_*` runs the learner's code on hidden cases, random and adversarial, and returns a
`CheckResult` (`.passed`, `.message`) after printing its message. It never raises for a wrong
answer: an exception inside the learner's code, or a result of the wrong type or shape, is a
failed check whose message says what happened. On failure the message names the first failing
case, what was expected and what came back, and a hint aimed at the likely mistake.

The references are svg_lib's own: `masked_softmax_times_v` for attention over kept keys, the
masks' closed-form pair counts, `Mask.tile_aligned` for B3's rounding, `plan_tiles` and
`estimate_vmem` for block sizes, `temporal_major_permutation` for the token order,
`reference_attention` for the B2 kernel, and the plans' tile counts for the per-tile cost fit. Case generators take a `seed` (fixed by default, so a
verdict is reproducible); the unit tests also run them with other seeds.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from svg_lib.attention import b3_mask
from svg_lib.core.geometry import VideoGeometry, temporal_major_permutation
from svg_lib.core.masks import Mask, SVGMask, _band_pairs
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.kernels.forward import _finish as finish_tile
from svg_lib.kernels.forward import _init_state, _interpreting, _online_softmax_tile, _scratch
from svg_lib.kernels.reference import masked_softmax_times_v, reference_attention
from svg_lib.kernels.tolerances import one_bf16_pass_slack, tolerance
from svg_lib.memory.vmem import estimate_vmem
from svg_lib.problem import BLOG_V6E_MS, get_preset
from svg_lib.tpu.cost import step_kinds

__all__ = ["CheckResult", "check_tile_body", "check_band_pair_count", "check_b2_dispatch",
           "check_balanced_rounding", "check_block_sizes", "check_temporal_permutation", "check_tile_cost_fit",
           "BlockSizeProblem", "block_size_problem", "block_size_cost", "b2_exercise_attention", "case_study_stages"]


# -- results and the machinery every checker shares ------------------------------------------

@dataclass
class CheckResult:
    """The verdict of one checker: `passed`, and a `message` saying why (printed when checked)."""

    exercise: str
    passed: bool
    message: str
    cases: int = 0  # hidden cases run (up to and including the first failure)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"CheckResult({self.exercise!r}, passed={self.passed}, cases={self.cases})"


class _Fail(Exception):
    """Raised inside a checker to stop at the first failing case (never escapes a checker)."""

    def __init__(self, detail: str, hint: str = ""):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


@dataclass
class _Case:
    name: str
    data: dict = field(default_factory=dict)


def _learner_exception(what: str, exc: BaseException, hints: dict | None = None) -> _Fail:
    kind = type(exc).__name__
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, NotImplementedError):
        return _Fail(f"{what} raised NotImplementedError{': ' + first if first else ''}",
                     "this is still the stub: replace the `raise NotImplementedError` line with your code")
    hint = ""
    for name, h in (hints or {}).items():
        if name in kind or name in first:
            hint = h
            break
    return _Fail(f"{what} raised {kind}: {first}", hint or "read the error above: it comes from your code, "
                 "on the inputs this case describes")


def _call(fn, what: str, *args, hints: dict | None = None, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # anything the learner's code raises is a failed case, not a crash
        raise _learner_exception(what, exc, hints) from None


def _finish(exercise: str, cases, run_case, summary: str) -> CheckResult:
    """Run `run_case(case)` over `cases`, stop at the first failure, print and return the verdict."""
    done = 0
    total = len(cases)
    for index, case in enumerate(cases, start=1):
        done = index
        try:
            run_case(case)
        except _Fail as fail:
            lines = [f"not yet: {exercise} fails hidden case {index} of {total}: {case.name}.",
                     f"  {fail.detail}"]
            if fail.hint:
                lines.append(f"  hint: {fail.hint}")
            return _show(CheckResult(exercise, False, "\n".join(lines), done))
        except Exception as exc:  # a result so odd that checking it failed: still the learner's verdict
            message = (f"not yet: {exercise} fails hidden case {index} of {total}: {case.name}.\n"
                       f"  checking your result raised {type(exc).__name__}: {exc}\n"
                       "  hint: return exactly the types and shapes the contract above describes")
            return _show(CheckResult(exercise, False, message, done))
    return _show(CheckResult(exercise, True, f"passed: {exercise}: all {total} hidden cases ({summary}).", done))


def _show(result: CheckResult) -> CheckResult:
    print(result.message)
    return result


def _fmt(x, digits: int = 4) -> str:
    """A short rendering of a number or a small array for messages."""
    a = np.asarray(x)
    if a.ndim == 0:
        v = a.item()
        return f"{v:.{digits}g}" if isinstance(v, float) else str(v)
    flat = a.ravel()
    shown = ", ".join(_fmt(v, digits) for v in flat[:6])
    return f"[{shown}{', ...' if flat.size > 6 else ''}]"


# == E1: the online-softmax tile body ==========================================================

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


# == E2: kept pairs of a band in one tile =======================================================

def _band_cases(seed: int) -> list[_Case]:
    rng = np.random.default_rng(seed)

    def case(name, q0, q1, k0, k1, w):
        return _Case(name, dict(args=(q0, q1, k0, k1, w)))

    cases = [
        case("a 128 x 128 tile on the diagonal, band_width 16", 0, 128, 0, 128, 16),
        case("one query and one key exactly band_width apart (q = 0, k = 40, band_width 40)", 0, 1, 40, 41, 40),
        case("band_width 0: only the diagonal q == k counts", 100, 164, 90, 200, 0),
        case("a tile below the diagonal (keys before queries)", 512, 640, 300, 428, 150),
        case("a tile far from the band: nothing kept", 0, 128, 1024, 1152, 100),
        case("a band wider than the whole sequence", 0, 300, 0, 300, 10 ** 6),
        case("an empty query range (q0 == q1)", 256, 256, 0, 512, 64),
        case("an empty key range (k0 == k1)", 0, 512, 77, 77, 64),
        case("a tall, thin tile crossing the band", 0, 1000, 480, 520, 30),
        case("ranges that do not start at a multiple of anything", 37, 211, 5, 389, 123),
    ]
    for _ in range(25):
        q0, k0 = (int(x) for x in rng.integers(0, 5000, 2))
        q1, k1 = q0 + int(rng.integers(0, 700)), k0 + int(rng.integers(0, 700))
        w = int(rng.choice([0, 1, int(rng.integers(0, 64)), int(rng.integers(0, 3000)), 10 ** 5]))
        cases.append(case(f"random: q in [{q0}, {q1}), k in [{k0}, {k1}), band_width {w}", q0, q1, k0, k1, w))
    return cases


def _band_reference(q0, q1, k0, k1, w) -> int:
    return int(_band_pairs(q0, q1, k0, k1, w))


def _as_count(value, what):
    if isinstance(value, (bool, np.bool_)):
        raise _Fail(f"{what} returned a bool ({value})", "return the number of pairs, an int")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        raise _Fail(f"{what} returned the float {value!r}",
                    "return an int: a pair count is a whole number, and floats lose exactness on large ranges "
                    "(use // rather than / in your formula)")
    raise _Fail(f"{what} returned {type(value).__name__}, expected an int", "return the number of pairs, an int")


def check_band_pair_count(fn, *, seed: int = 0) -> CheckResult:
    """E2: `fn(q0, q1, k0, k1, band_width) -> int` counts (q, k) in the tile with |q - k| <= band_width.

    Compared with svg_lib's closed form on named and random tiles, then timed on growing tiles
    (up to 2^30 tokens a side): a count that loops over pairs, or rows, cannot keep up.
    """
    def run(case):
        q0, q1, k0, k1, w = case.data["args"]
        if "timed" in case.data:
            return run_timed(case)
        got = _as_count(_call(fn, "band_pair_count", q0, q1, k0, k1, w), "band_pair_count")
        want = _band_reference(q0, q1, k0, k1, w)
        if got == want:
            return
        area = max(q1 - q0, 0) * max(k1 - k0, 0)
        detail = f"band_pair_count({q0}, {q1}, {k0}, {k1}, band_width={w}): expected {want:,}, got {got:,}"
        if got < 0:
            hint = "a count can't be negative: some overlap or range length in your formula needs clipping at 0"
        elif got > area:
            hint = (f"the tile only has {area:,} pairs; some part of your formula counts pairs outside "
                    "[q0, q1) x [k0, k1)")
        elif w > 0 and got == _band_reference(q0, q1, k0, k1, w - 1):
            hint = ("your count equals the count for band_width - 1: pairs exactly band_width apart are kept "
                    "(|q - k| <= band_width, not <)")
        elif got == _band_reference(q0, q1, k0, k1, w + 1):
            hint = "your count equals the count for band_width + 1: the band ends at distance band_width, inclusive"
        elif got == area and want < area:
            hint = "you counted every pair of the tile: only pairs with |q - k| <= band_width count"
        elif area <= 10 ** 6 and got in _one_sided_counts(q0, q1, k0, k1, w):
            hint = ("you counted one side of the diagonal only: the band is symmetric, it holds keys before "
                    "and after each query")
        else:
            hint = ("per row q the kept keys are the interval [q - band_width, q + band_width] clipped to "
                    "[k0, k1); try the case on paper, row by row")
        raise _Fail(detail, hint)

    def run_timed(case):
        for size_log2 in range(6, 31, 2):
            size = 2 ** size_log2
            q0, k0 = 3 * size // 4, 0
            args = (q0, q0 + size, k0, k0 + size, size // 3)
            start = time.perf_counter()
            got = _as_count(_call(fn, "band_pair_count", *args), "band_pair_count")
            seconds = time.perf_counter() - start
            want = _band_reference(*args)
            if got != want:
                raise _Fail(f"band_pair_count{args}: expected {want:,}, got {got:,}",
                            "right on small tiles, wrong on a large one: check for integer overflow (numpy's int32 "
                            "or int64 squares) or float rounding; Python ints never overflow")
            if seconds > 0.1:
                raise _Fail(f"a tile of 2^{size_log2} x 2^{size_log2} tokens took {seconds:.2f} s",
                            "the count must come from a formula in the five numbers, not from a loop (or an array) "
                            "over pairs or rows: kernels ask for it for every tile of a 75,600-token mask")

    cases = _band_cases(seed)
    cases.append(_Case("growing tiles, 64 up to 2^30 tokens a side (the count must be closed form)",
                       dict(args=(0, 0, 0, 0, 0), timed=True)))
    return _finish("E2 band_pair_count", cases, run,
                   "diagonal and off-diagonal tiles, band_width 0 and wider than the sequence, empty ranges, "
                   "random tiles, and tiles up to 2^30 tokens a side")


def _one_sided_counts(q0, q1, k0, k1, w):
    q = np.arange(q0, q1)[:, None]
    k = np.arange(k0, k1)[None, :]
    diff = q - k
    return {int(((diff >= 0) & (diff <= w)).sum()), int(((diff <= 0) & (-diff <= w)).sum())}


# == E3: B2's dispatch inside a working Pallas kernel ===========================================

MASK_FREE_PATH, MASKED_PATH = 1, 16  # what the exercise kernel records per tile body run (16 so counts add up)


def b2_exercise_attention(q, k, v, mask: Mask, dispatch, *, block_q: int = 128, block_kv: int = 128,
                          interpret=True):
    """The B2 kernel with its dispatch left to `dispatch(step_class, tile, keep)`.

    q, k, v `[heads, tokens, head_dim]` float32 (unscaled; scaled by 1/sqrt(head_dim) here).
    Returns `(out [heads, tokens, head_dim], paths [heads, q_tiles, steps] int32)`: `paths`
    records, for every grid step, the tile bodies that ran: MASK_FREE_PATH (1) per mask-free
    run plus MASKED_PATH (16) per masked run, so 0 means the step computed nothing.
    `dispatch` receives the step's class (EMPTY / PARTIAL / FULL, read from SMEM), `tile`
    (call `tile(keep=None)` for the mask-free body or `tile(keep=keep)` for the masked one) and
    `keep`, the mask's elementwise predicate.
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    heads, tokens, head_dim = q.shape
    plan = plan_tiles(mask, block_q, block_kv)
    # the plan's two tables as they are (the series' kernels read them packed, notebook 03)
    kv_index, step_class = (jnp.asarray(t, jnp.int32) for t in (plan.kv_index, plan.step_class))
    nq, steps = plan.kv_index.shape
    q_len, kv_len = nq * block_q, plan.grid[1] * block_kv
    keep = mask.kernel_predicate(block_q, block_kv)

    def kernel(kv_index_ref, step_class_ref, q_ref, k_ref, v_ref, o_ref, path_ref, m_ref, l_ref, acc_ref):
        i, s = pl.program_id(1), pl.program_id(2)

        @pl.when((i == 0) & (s == 0))
        def _():
            path_ref[...] = jnp.zeros(path_ref.shape, jnp.int32)

        @pl.when(s == 0)
        def _():
            _init_state(m_ref, l_ref, acc_ref)

        body = functools.partial(_online_softmax_tile, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref,
                                 q_start=i * block_q, k_start=kv_index_ref[i, s] * block_kv,
                                 block_kv_compute=block_kv, interpret=_interpreting(interpret))

        def tile(keep=None):
            body(keep=keep)
            path_ref[i, s] += MASK_FREE_PATH if keep is None else MASKED_PATH

        dispatch(step_class_ref[i, s], tile, keep)

        @pl.when(s == steps - 1)
        def _():
            finish_tile(m_ref, l_ref, acc_ref, o_ref, _interpreting(interpret))

    def q_map(h, i, s, kv_index_ref, *_):
        return h, i, 0

    def kv_map(h, i, s, kv_index_ref, *_):
        return h, kv_index_ref[i, s], 0

    def path_map(h, i, s, *_):
        return h, 0, 0

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(heads, nq, steps),
            in_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                      pl.BlockSpec((None, block_kv, head_dim), kv_map),
                      pl.BlockSpec((None, block_kv, head_dim), kv_map)],
            out_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                       pl.BlockSpec((None, nq, steps), path_map)],
            scratch_shapes=_scratch(block_q, head_dim)),
        out_shape=[jax.ShapeDtypeStruct((heads, q_len, head_dim), q.dtype),
                   jax.ShapeDtypeStruct((heads, nq, steps), jnp.int32)],
        interpret=interpret,
    )
    qs = q * (1.0 / math.sqrt(head_dim))
    out, paths = call(kv_index, step_class, jnp.pad(qs, ((0, 0), (0, q_len - tokens), (0, 0))),
                      jnp.pad(k, ((0, 0), (0, kv_len - tokens), (0, 0))),
                      jnp.pad(v, ((0, 0), (0, kv_len - tokens), (0, 0))))
    return out[:, :tokens], paths, plan


def _path_words(code: int) -> str:
    free, masked = code % MASKED_PATH, code // MASKED_PATH
    parts = []
    if free:
        parts.append("the mask-free body" + (f" {free} times" if free > 1 else ""))
    if masked:
        parts.append("the masked body" + (f" {masked} times" if masked > 1 else ""))
    return " and ".join(parts) if parts else "nothing"


_DISPATCH_HINTS = {
    "TracerBool": ("step_class is read from SMEM while the kernel runs, so a Python `if` cannot see its value "
                   "when the kernel is traced: wrap each branch in pl.when(condition)"),
    "Concretization": ("step_class is a traced value, known only when the kernel runs: compare it inside "
                       "pl.when(...) instead of converting it to a Python value"),
}


def check_b2_dispatch(fn, *, seed: int = 0) -> CheckResult:
    """E3: `fn(step_class, tile, keep)` is B2's dispatch inside `b2_exercise_attention`.

    Runs the kernel in interpret mode on small SVG masks (one with key padding, one whose rows
    visit different numbers of tiles, so some grid steps are idle), checks which tile body every
    grid step ran against the planner's classes (FULL: mask-free once; PARTIAL: masked once;
    idle EMPTY steps: nothing), then the output against `reference_attention`.
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    specs = [("a 3-frame video of 8 x 16 tokens (384 tokens, 3 x 3 tiles of 128), density 0.35",
              VideoGeometry(3, 8, 16), 0.35, True),
             ("4 frames of 8 x 15 tokens (480 tokens): the last key tile reaches into padding, some steps idle",
              VideoGeometry(4, 8, 15), 0.2, False)]
    cases = [_Case(name, dict(geometry=g, density=d, sink=sink, seed=int(rng.integers(2**31))))
             for name, g, d, sink in specs]

    def run(case):
        g = case.data["geometry"]
        mask = SVGMask.spatial(g, case.data["density"], first_frame_sink=case.data["sink"])
        keys = jax.random.split(jax.random.key(case.data["seed"]), 3)
        q, k, v = (jax.random.normal(key, (1, g.tokens, 128), jnp.float32) for key in keys)
        out, paths, plan = _call(b2_exercise_attention, "your dispatch (inside the kernel)", q, k, v, mask, fn,
                                 hints=_DISPATCH_HINTS)
        paths = np.asarray(paths)[0]
        expected = np.where(plan.step_class == FULL, MASK_FREE_PATH,
                            np.where(plan.step_class == PARTIAL, MASKED_PATH, 0))
        wrong = np.argwhere(paths != expected)
        if wrong.size:
            i, s = (int(x) for x in wrong[0])
            cls = int(plan.step_class[i, s])
            j = int(plan.kv_index[i, s])
            what = {FULL: "a FULL tile", PARTIAL: "a PARTIAL (edge) tile", EMPTY: "an idle step (class EMPTY)"}[cls]
            tile_words = f"key tile {j}" if cls != EMPTY else f"it repeats key tile {j} so that no DMA is issued"
            detail = (f"grid step (query tile {i}, step {s}) is {what} ({tile_words}): expected "
                      f"{_path_words(int(expected[i, s]))}, your dispatch ran {_path_words(int(paths[i, s]))}")
            got = int(paths[i, s])
            if cls == EMPTY:
                hint = ("an idle step must compute nothing: its key tile was already folded in at the step before, "
                        "so computing it adds that tile's keys a second time")
            elif got >= 2 * MASKED_PATH or got % MASKED_PATH >= 2 or (got % MASKED_PATH and got // MASKED_PATH):
                hint = "each visited step runs exactly one tile body: the conditions of your branches overlap"
            elif cls == FULL and got // MASKED_PATH:
                hint = ("a FULL tile keeps every pair, so the mask cannot change it: evaluating it anyway is the "
                        "per-element VPU work B1 pays and B2 removes")
            elif cls == PARTIAL and got % MASKED_PATH:
                hint = ("a PARTIAL tile is cut by the mask's edge (or reaches into key padding): without keep, its "
                        "dropped pairs leak into the softmax")
            else:
                hint = "every visited step must run one of the two tile bodies: which class did your branches leave out?"
            raise _Fail(detail, hint)
        want = np.asarray(reference_attention(q, k, v, mask))
        got_out = np.asarray(out)
        # the learner's code is the dispatch only: svg_lib's tile body does the arithmetic, its matmuls
        # at float32 precision on every backend, so the kernels' float32 tolerance applies
        if not np.allclose(got_out, want, **tolerance("float32")):
            err = float(np.max(np.abs(got_out - want)))
            raise _Fail(f"every step ran the expected path, but the output differs from reference attention "
                        f"(max error {err:.2g})", "pass the `keep` you were given to the masked body, unchanged")

    return _finish("E3 b2_dispatch", cases, run,
                   "every grid step ran the path its class asks for, and the outputs match reference attention")


# == E4: B3's balanced rounding ================================================================

class _TileCounts(Mask):
    """A mask known only by its kept pairs per `block` x `block` tile (for E4's designed cases)."""

    def __init__(self, counts, tokens: int, block: int):
        self.tokens, self.block = int(tokens), int(block)
        self.counts = np.asarray(counts, dtype=np.int64)

    def keep(self, q, k):
        raise NotImplementedError("_TileCounts only knows its pair counts per tile")

    def pair_counts(self, q_edges, k_edges):
        return self.counts.copy()


def _rounding_case(name, mask: Mask, block_q: int, block_kv: int) -> _Case:
    """Boundary tiles of `mask` (flat order), their kept pairs and areas, and svg_lib's balanced choice."""
    rounded = mask.tile_aligned(block_q, block_kv, policy="balanced")
    nq, nk = rounded.kept.shape
    q_edges = np.minimum(np.arange(nq + 1) * block_q, mask.tokens)
    k_edges = np.minimum(np.arange(nk + 1) * block_kv, mask.tokens)
    counts = mask.pair_counts(q_edges, k_edges)
    area = np.diff(q_edges)[:, None] * np.diff(k_edges)[None, :]
    boundary = (counts > 0) & (counts < area)
    report = rounded.report
    assert int(counts[boundary].sum()) == report.boundary_budget  # the same tiles as svg_lib's rounding
    return _Case(name, dict(kept=counts[boundary].astype(np.int64), area=area[boundary].astype(np.int64),
                            budget=int(report.boundary_budget), reference=rounded.kept[boundary]))


def _designed_case(name, kept_fraction_rows, tokens=None, block=128):
    """A case from a grid of kept counts: every tile with 0 < kept < area is a boundary tile."""
    counts = np.asarray(kept_fraction_rows, dtype=np.int64)
    nq, nk = counts.shape
    tokens = tokens or max(nq, nk) * block
    mask = _TileCounts(counts, tokens, block)
    return _rounding_case(name, mask, block, block)


def _rounding_cases(seed: int) -> list[_Case]:
    rng = np.random.default_rng(seed)
    A = 128 * 128
    cases = [
        _rounding_case("the SVG mask of 3 frames x 8 x 16 tokens at density 0.35, 128 x 128 tiles",
                       SVGMask.spatial(VideoGeometry(3, 8, 16), 0.35), 128, 128),
        _designed_case("no boundary tiles at all (every tile full or empty)", [[A, 0], [0, A]]),
        _designed_case("one boundary tile with 40 % of its pairs kept", [[A, int(0.4 * A)], [0, A]]),
        _designed_case("one boundary tile with 70 % of its pairs kept", [[A, int(0.7 * A)], [0, A]]),
        _designed_case("four boundary tiles, each exactly half kept (a tie in the ranking)",
                       [[A // 2, A // 2], [A // 2, A // 2]]),
        _designed_case("ten boundary tiles at 30 % each: the budget asks for three of them whole",
                       [[int(0.3 * A)] * 5, [int(0.3 * A)] * 5] + [[0] * 5] * 3),
        _designed_case("nine boundary tiles at 90 % each: the budget asks to drop about one",
                       [[int(0.9 * A)] * 3] * 3),
        # 200 tokens in tiles of 128: the last row and column of tiles are cut short by the sequence's end,
        # so a tile keeping fewer pairs can keep a larger fraction of them
        _designed_case("tiles of different areas (the sequence ends inside the last row and column of tiles)",
                       [[9000, 4000], [3000, 5000]], tokens=200),
        _designed_case("two tiles whose prefixes sit equally far from the budget (either choice is right)",
                       [[int(0.75 * A), int(0.75 * A)], [0, 0]]),
    ]
    geometries = [VideoGeometry(3, 8, 16), VideoGeometry(5, 6, 20), VideoGeometry(4, 10, 13, text_tokens=30),
                  VideoGeometry(21, 8, 15), VideoGeometry(7, 9, 9)]
    for _ in range(8):
        g = geometries[int(rng.integers(len(geometries)))]
        density = float(rng.uniform(0.15, 0.6))
        sink = bool(rng.random() < 0.7)
        bq, bkv = (int(x) * 128 for x in rng.integers(1, 4, 2))
        mask = SVGMask.spatial(g, density, first_frame_sink=sink)
        cases.append(_rounding_case(f"random: SVG mask, {g}, density {density:.2f}"
                                    f"{'' if sink else ', no sink'}, {bq} x {bkv} tiles", mask, bq, bkv))
    return cases


def check_balanced_rounding(fn, *, seed: int = 0) -> CheckResult:
    """E4: `fn(kept, area, budget) -> bool [tiles]` chooses the boundary tiles B3 keeps whole.

    kept, area: int arrays `[tiles]` (kept pairs and pairs of each boundary tile); budget: the
    pairs the kept tiles should add up to (the exact mask's pairs in boundary tiles). Accepted: a
    prefix of the tiles ranked by kept fraction (ties in any order) whose area is as close to the
    budget as svg_lib's `Mask.tile_aligned(..., policy="balanced")` gets.
    """
    def run(case):
        kept, area, budget, ref = (case.data[x] for x in ("kept", "area", "budget", "reference"))
        got = _call(fn, "balanced_rounding", kept.copy(), area.copy(), budget)
        try:
            chosen = np.asarray(got)
        except Exception:
            raise _Fail(f"balanced_rounding returned {type(got).__name__}, expected a bool array",
                        "return one True/False per boundary tile") from None
        if chosen.shape != kept.shape or (chosen.dtype != bool and chosen.size):
            kind = "indices" if chosen.dtype.kind in "iu" and chosen.shape != kept.shape else f"dtype {chosen.dtype}"
            raise _Fail(f"expected a bool array of shape {kept.shape}, got shape {chosen.shape} ({kind})",
                        "return a keep-whole flag per boundary tile (np.zeros(len(kept), bool), then set the chosen "
                        "ones), not the indices of the chosen tiles")
        chosen = chosen.astype(bool)
        got_pairs, ref_pairs = int(area[chosen].sum()), int(area[ref].sum())
        ref_gap = abs(ref_pairs - budget)
        n = kept.size
        if n and chosen.all() and ref_gap < abs(got_pairs - budget):
            raise _Fail(f"you keep all {n} boundary tiles whole ({got_pairs:,} pairs) for a budget of {budget:,} pairs",
                        "rounding every boundary tile up is lossless but computes every pair the edges add; "
                        "B3 keeps only as many as the budget pays for")
        if n and not chosen.any() and ref_gap < abs(got_pairs - budget):
            raise _Fail(f"you drop all {n} boundary tiles (0 pairs) for a budget of {budget:,} pairs",
                        "rounding every boundary tile down loses every kept pair in them; some tiles should stay")
        # a prefix of the ranking: every kept tile covers at least the fraction of every dropped one
        if chosen.any() and (~chosen).any():
            ki, ai = kept[chosen].astype(object), area[chosen].astype(object)
            kd, ad = kept[~chosen].astype(object), area[~chosen].astype(object)
            worst_kept = min(range(ki.size), key=lambda t: (ki[t] / ai[t], t))
            best_dropped = max(range(kd.size), key=lambda t: (kd[t] / ad[t], -t))
            if ki[worst_kept] * ad[best_dropped] < kd[best_dropped] * ai[worst_kept]:
                a_idx = int(np.flatnonzero(chosen)[worst_kept])
                b_idx = int(np.flatnonzero(~chosen)[best_dropped])
                hint = ("rank the tiles by the fraction of their pairs the mask keeps, kept / area, and keep the "
                        "best-covered ones first")
                if kept[a_idx] > kept[b_idx]:
                    hint += " (the fraction, not the number of kept pairs: tiles at the sequence's end are smaller)"
                raise _Fail(f"you keep tile {a_idx} ({kept[a_idx]:,} of {area[a_idx]:,} pairs kept, "
                            f"{kept[a_idx] / area[a_idx]:.1%}) but drop tile {b_idx} ({kept[b_idx]:,} of "
                            f"{area[b_idx]:,}, {kept[b_idx] / area[b_idx]:.1%})", hint)
        gap = abs(got_pairs - budget)
        if gap > ref_gap:
            side = "above" if got_pairs > budget else "below"
            fewer_more = "fewer" if got_pairs > budget else "more"
            raise _Fail(f"your {int(chosen.sum())} kept tiles hold {got_pairs:,} pairs, {gap:,} {side} the budget of "
                        f"{budget:,}; keeping {fewer_more} tiles of the ranking gets within {ref_gap:,}",
                        "among all prefixes of the ranking (including the empty one and all of it), take the one "
                        "whose total area is closest to the budget, on either side of it")

    return _finish("E4 balanced_rounding", _rounding_cases(seed), run,
                   "SVG masks at random sizes, no boundary tiles, ties in the ranking and in the distance, "
                   "tiles cut short by the sequence's end")


# == E5: block sizes under a VMEM budget =========================================================

@dataclass(frozen=True)
class BlockSizeProblem:
    """A block-size choice for B2: the mask, the kernel's data, the VMEM budget and the cost model.

    cost(block_q, block_kv) in microseconds per head =
        grid_steps * step_us + masked_pairs * mask_us_per_mpair / 1e6
    with grid_steps = query tiles * schedule steps (`plan.grid[0] * plan.steps`) and
    masked_pairs = masked tiles * block_q * block_kv (`plan.needs_mask.sum()` tiles; the mask is
    evaluated on every element of a masked tile). A choice must be one of the candidates and fit:
    `estimate_vmem(method, block_q, block_kv, head_dim, dtype, generation=generation).total`
    at most `vmem_budget_bytes`.
    """

    name: str
    mask: Mask
    head_dim: int
    dtype: str
    vmem_budget_bytes: int
    step_us: float
    mask_us_per_mpair: float
    block_q_candidates: tuple
    block_kv_candidates: tuple
    method: str = "b2"
    generation: str = "v6e"

    @property
    def candidates(self) -> list[tuple[int, int]]:
        return [(bq, bkv) for bq in self.block_q_candidates for bkv in self.block_kv_candidates]

    def __str__(self) -> str:
        return (f"{self.name}: {self.mask.tokens:,} tokens, {self.method} in {self.dtype}, head_dim {self.head_dim}, "
                f"VMEM budget {self.vmem_budget_bytes / 2**20:g} MiB ({self.generation}), "
                f"{self.step_us:.3g} us per grid step, {self.mask_us_per_mpair:.3g} us per million masked pairs, "
                f"{len(self.candidates)} candidates")


def block_size_problem(name: str = "blog") -> BlockSizeProblem:
    """The E5 problem named `name`: "blog" (the case study's mask, the notebook's problem) or "small"."""
    preset = get_preset(name)
    if name == "blog":
        # prices: notebook 05's assumed 0.35 us per grid step, and 1 us per million masked pairs, which
        # puts the optimum between the least-masking and the fewest-steps corners
        return BlockSizeProblem("the case study on one v6e", preset.mask(), preset.head_dim, preset.dtype,
                                36 * 2**20, 0.35, 1.0, (512, 1024, 1536, 2048, 2560, 3328, 4096, 4864),
                                (512, 1024, 1536, 2048, 3072))
    if name == "small":
        return BlockSizeProblem("the small preset", preset.mask(), preset.head_dim, preset.dtype,
                                8 * 2**20, 0.35, 0.5, (128, 256, 384, 512, 768, 1024), (128, 256, 512, 1024))
    raise ValueError(f"unknown E5 problem {name!r}; choose 'blog' or 'small'")


_PLANS: dict = {}


def block_size_cost(problem: BlockSizeProblem, block_q: int, block_kv: int) -> dict:
    """The cost terms of one choice: grid steps, masked pairs, cost in us, VMEM bytes and whether it fits."""
    key = (id(problem.mask), block_q, block_kv)
    entry = _PLANS.get(key)
    if entry is None or entry[0] is not problem.mask:
        plan = plan_tiles(problem.mask, block_q, block_kv)
        entry = (problem.mask, plan.grid[0] * plan.steps, int(plan.needs_mask.sum()) * block_q * block_kv)
        _PLANS[key] = entry
        while len(_PLANS) > 512:
            _PLANS.pop(next(iter(_PLANS)))
    _, steps, masked_pairs = entry
    vmem = estimate_vmem(problem.method, block_q, block_kv, problem.head_dim, problem.dtype,
                         generation=problem.generation).total
    return dict(grid_steps=steps, masked_pairs=masked_pairs,
                cost_us=steps * problem.step_us + masked_pairs * problem.mask_us_per_mpair / 1e6,
                vmem_bytes=int(vmem), fits=vmem <= problem.vmem_budget_bytes)


def _block_size_problems(seed: int) -> list[BlockSizeProblem]:
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    blog, small = block_size_problem("blog"), block_size_problem("small")
    problems = [
        blog,
        replace(small, name="the small preset, where grid steps are expensive", step_us=4.0),
        replace(small, name="the small preset with a tight VMEM budget (the cheapest candidates do not fit)",
                vmem_budget_bytes=3 * 2**20, mask_us_per_mpair=0.5),
        replace(small, name="the small preset, where masking is expensive", mask_us_per_mpair=20.0),
    ]
    geometry = VideoGeometry(int(rng.integers(6, 22)), int(rng.integers(6, 17)), int(rng.integers(10, 31)))
    density = float(rng.uniform(0.2, 0.5))
    problems.append(replace(small, name=f"random: {geometry}, density {density:.2f}",
                            mask=SVGMask.spatial(geometry, density), step_us=float(rng.uniform(0.2, 3.0)),
                            mask_us_per_mpair=float(rng.uniform(0.2, 5.0)),
                            vmem_budget_bytes=int(rng.choice([4, 6, 8, 16])) * 2**20))
    return problems


def _explain_choice(problem: BlockSizeProblem, choice) -> None:
    """Raise _Fail unless `choice` is a cheapest candidate that fits `problem`."""
    if not isinstance(choice, (tuple, list)) or len(choice) != 2 or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in choice):
        raise _Fail(f"got {choice!r}, expected a pair of ints (block_q, block_kv)", "return (block_q, block_kv)")
    bq, bkv = (int(x) for x in choice)
    if bq not in problem.block_q_candidates or bkv not in problem.block_kv_candidates:
        raise _Fail(f"({bq}, {bkv}) is not a candidate: block_q must be one of {list(problem.block_q_candidates)}, "
                    f"block_kv one of {list(problem.block_kv_candidates)}",
                    "search problem.block_q_candidates x problem.block_kv_candidates")
    terms = block_size_cost(problem, bq, bkv)
    MiB = 2**20
    if not terms["fits"]:
        raise _Fail(f"({bq}, {bkv}) needs {terms['vmem_bytes'] / MiB:.1f} MiB of VMEM (estimate_vmem), over the "
                    f"budget of {problem.vmem_budget_bytes / MiB:g} MiB",
                    "a choice that does not fit cannot run at all, whatever it would cost: filter by "
                    "estimate_vmem(...).total <= problem.vmem_budget_bytes before comparing costs")
    fitting = [(block_size_cost(problem, q, k), (q, k)) for q, k in problem.candidates]
    fitting = [(t, c) for t, c in fitting if t["fits"]]
    best_terms, best = min(fitting, key=lambda tc: tc[0]["cost_us"])
    if terms["cost_us"] > best_terms["cost_us"] * (1 + 1e-9):
        cheaper = sum(t["cost_us"] < terms["cost_us"] * (1 - 1e-9) for t, _ in fitting)
        steps_word = "fewer" if best_terms["grid_steps"] < terms["grid_steps"] else "more"
        masked_word = "fewer" if best_terms["masked_pairs"] < terms["masked_pairs"] else "more"
        detail = (f"({bq}, {bkv}) fits but costs {terms['cost_us']:,.1f} us = {terms['grid_steps']:,} grid steps x "
                  f"{problem.step_us:.3g} us + {terms['masked_pairs'] / 1e6:,.1f} M masked pairs x "
                  f"{problem.mask_us_per_mpair:.3g} us; {cheaper} fitting candidate(s) cost less, the cheapest "
                  f"{best_terms['cost_us']:,.1f} us with {steps_word} grid steps and {masked_word} masked pairs")
        hint = "compute both terms of the cost for every candidate that fits, then take the minimum"
        if terms["grid_steps"] == min(t["grid_steps"] for t, _ in fitting):
            hint = "fewest grid steps alone is not the cost: the masked pairs' term counts too"
        elif terms["masked_pairs"] == min(t["masked_pairs"] for t, _ in fitting):
            hint = "least masking alone is not the cost: the grid steps' term counts too (the case study's lesson)"
        raise _Fail(detail, hint)


def check_block_sizes(choice, *, seed: int = 0) -> CheckResult:
    """E5: a `(block_q, block_kv)` choice, or a function `problem -> (block_q, block_kv)`.

    A pair is checked against the notebook's problem (`block_size_problem("blog")`). A function
    is run on that problem and on hidden ones (other sizes, budgets that exclude the cheapest
    candidates, other cost weights). A choice passes if it is a candidate, fits the VMEM budget
    (`estimate_vmem`) and no fitting candidate costs less; a rejected choice is explained.
    """
    if callable(choice):
        problems = _block_size_problems(seed)
        cases = [_Case(str(p.name), dict(problem=p)) for p in problems]

        def run(case):
            problem = case.data["problem"]
            picked = _call(choice, "your function", problem)
            _explain_choice(problem, picked)

        return _finish("E5 block sizes", cases, run,
                       "the case study's mask, expensive steps, expensive masking, a tight VMEM budget, a random problem")
    problem = block_size_problem("blog")
    return _finish("E5 block sizes", [_Case(f"your choice {choice!r} for {problem.name}", dict(problem=problem))],
                   lambda case: _explain_choice(problem, choice), "the cheapest choice that fits")


# == E6: the temporal-major permutation ==========================================================

def check_temporal_permutation(fn, *, seed: int = 0) -> CheckResult:
    """E6: `fn(frames, frame_tokens) -> int array [frames * frame_tokens]`, the gather into temporal-major order.

    Compared with `svg_lib.temporal_major_permutation` on named and random sizes.
    """
    rng = np.random.default_rng(seed)
    sizes = [("3 frames of 4 tokens", 3, 4), ("2 frames of 5 tokens", 2, 5), ("one frame of 7 tokens", 1, 7),
             ("6 frames of one token each", 6, 1), ("21 frames of 3,600 tokens (the case study)", 21, 3600)]
    for _ in range(10):
        F, S = int(rng.integers(1, 30)), int(rng.integers(1, 60))
        sizes.append((f"random: {F} frames of {S} tokens", F, S))
    cases = [_Case(name, dict(F=F, S=S)) for name, F, S in sizes]

    def run(case):
        F, S = case.data["F"], case.data["S"]
        want = temporal_major_permutation(VideoGeometry(F, 1, S))
        got = _call(fn, "temporal_major_permutation", F, S)
        try:
            perm = np.asarray(got)
        except Exception:
            raise _Fail(f"returned {type(got).__name__}, expected an int array", "return a numpy int array") from None
        if perm.shape != want.shape:
            raise _Fail(f"expected shape ({F * S},) (frames * frame_tokens), got {perm.shape}",
                        "one entry per position of the new order: a flat array of frames * frame_tokens ints")
        if perm.dtype.kind not in "iu":
            raise _Fail(f"expected an integer array, got dtype {perm.dtype}",
                        "these are gather indices: build them with integer arithmetic (// and %)")
        if np.array_equal(perm, want):
            return
        j = int(np.flatnonzero(perm != want)[0])
        detail = (f"position {j}: expected token {int(want[j])} (frame {int(want[j]) // S}, slot {int(want[j]) % S}), "
                  f"got {int(perm[j])}; first entries expected {_fmt(want[:8])}, got {_fmt(perm[:8])}")
        if np.array_equal(np.sort(perm), np.arange(F * S)):
            inverse = np.empty_like(want)
            inverse[want] = np.arange(F * S)
            if np.array_equal(perm, inverse):
                hint = ("you returned the inverse permutation (frames and slots swapped): entry j must name the "
                        "frame-major token that lands at position j, so that x_temporal = x[perm]; your array says "
                        "where each token goes")
            elif np.array_equal(perm, np.arange(F * S)):
                hint = "that is the identity (frame-major order itself): the F copies of one spatial slot must become neighbours"
            else:
                hint = ("in temporal-major order, neighbouring positions step through the frames of one spatial "
                        "slot before moving on to the next slot")
        else:
            hint = ("not a permutation: every token index 0 .. frames * frame_tokens - 1 must appear exactly "
                    "once (check that you use frames and frame_tokens where each belongs)")
        raise _Fail(detail, hint)

    return _finish("E6 temporal_major_permutation", cases, run,
                   "small and case-study sizes, one frame, one token per frame, random sizes")


# == E7: two per-tile costs fitted on two stages ====================================================

def case_study_stages(preset: str = "blog") -> dict:
    """{stage: (full tiles, masked tiles, latency ms)} for the case study's B0 to B3.

    Tile counts per head from svg_lib's plans of the preset's mask (B3: of its tile-aligned
    mask; B0: Splash's dense grid at the same blocks, every tile mask-free); latencies: the case
    study's v6e measurements (`svg_lib.problem.BLOG_V6E_MS`), meaningful for the "blog" preset only.
    """
    p = get_preset(preset)
    mask = p.mask()
    plan = plan_tiles(mask, p.block_q, p.block_kv)
    b3_plan = plan_tiles(b3_mask(mask, p.block_q, p.block_kv), p.block_q, p.block_kv)
    stages = {}
    for method, stage in (("splash_dense", "B0"), ("b1", "B1"), ("b2", "B2"), ("b3", "B3")):
        kinds = step_kinds(method, plan, b3_plan)
        masked = kinds.get("svg_masked", 0) + kinds.get("padding_masked", 0)
        stages[stage] = (kinds.get("free", 0), masked, BLOG_V6E_MS[method])
    return stages


def _solve_costs(x, y):
    """(a, b) with full * a + masked * b = latency for both stages, or None if the mixes are proportional."""
    (fx, mx, tx), (fy, my, ty) = x, y
    det = fx * my - fy * mx
    if det == 0:
        return None
    return (tx * my - ty * mx) / det, (fx * ty - fy * tx) / det


def _tile_cost_cases(seed: int) -> list[_Case]:
    s = case_study_stages("blog")
    named = [("the case study's B2 and B3", "B2", "B3"), ("B3 and B2 (the same two stages, the other order)", "B3", "B2"),
             ("B0 and B1: one stage has no masked tile, the other no full one", "B0", "B1"),
             ("B1 and B3", "B1", "B3")]
    cases = [_Case(f"{name}: {_stage_words(s[x])} and {_stage_words(s[y])}", dict(x=s[x], y=s[y]))
             for name, x, y in named]
    rng = np.random.default_rng(seed)
    while len(cases) < 12:
        a = float(rng.uniform(0.01, 1.0))
        b = a * float(rng.uniform(1.0, 4.0))
        counts = rng.integers(0, 2000, size=(2, 2))
        if counts[0, 0] * counts[1, 1] == counts[1, 0] * counts[0, 1]:
            continue
        x, y = ((int(f), int(m), f * a + m * b) for f, m in counts)
        cases.append(_Case(f"random stages, a = {a:.4g}, b = {b:.4g}: {_stage_words(x)} and {_stage_words(y)}",
                           dict(x=x, y=y)))
    same = (s["B2"][0] * 2, s["B2"][1] * 2, s["B2"][2] * 2)
    cases.append(_Case(f"two stages with the same mix of tiles: {_stage_words(s['B2'])} and {_stage_words(same)}",
                       dict(x=s["B2"], y=same, singular=True)))
    cases.append(_Case("a stage with no tile at all: (0, 0, 0.0) and " + _stage_words(s["B1"]),
                       dict(x=(0, 0, 0.0), y=s["B1"], singular=True)))
    return cases


def _stage_words(stage) -> str:
    full, masked, ms = stage
    return f"({full} full, {masked} masked, {ms:.6g} ms)"


def _as_costs(value):
    try:
        a, b = value
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        raise _Fail(f"returned {value!r}, expected a pair of numbers (a, b)",
                    "return a tuple (a, b): a full tile's cost, then a masked tile's") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise _Fail(f"returned ({a}, {b}): not finite numbers",
                    "a division by a determinant of 0 gives inf or nan: that case should raise ValueError instead")
    return a, b


def check_tile_cost_fit(fn, *, seed: int = 0) -> CheckResult:
    """E7: `fn(stage_x, stage_y) -> (a, b)`, each stage `(full_tiles, masked_tiles, latency)`.

    `a` is a full (mask-free) tile's cost and `b` a masked tile's, such that
    `full * a + masked * b = latency` holds for both stages. Where the two stages' tile mixes
    are proportional no unique answer exists, and `fn` must raise ValueError. Checked on the
    case study's stages (`case_study_stages`), in both orders, and on random stages.
    """
    def run(case):
        x, y = case.data["x"], case.data["y"]
        if case.data.get("singular"):
            return run_singular(x, y)
        want = _solve_costs(x, y)
        got = _as_costs(_call(fn, "fit_tile_costs", x, y))
        scale = max(abs(want[0]), abs(want[1]))
        if all(abs(g - w) <= 1e-6 * scale for g, w in zip(got, want)):
            return
        detail = f"fit_tile_costs{(x, y)}: expected (a, b) = ({want[0]:.6g}, {want[1]:.6g}), got ({got[0]:.6g}, {got[1]:.6g})"
        close = lambda u, v: all(abs(g - w) <= 1e-6 * scale for g, w in zip(u, v))
        model = [f * got[0] + m * got[1] for f, m, _ in (x, y)]
        if close(got, want[::-1]):
            hint = "you returned (b, a): a comes first, the cost of a full (mask-free) tile; b is a masked tile's"
        elif close(got, (want[0], want[1] - want[0])):
            hint = ("your b is b - a: you counted a masked tile as a full tile too. A tile is either full or masked: "
                    "latency = full * a + masked * b")
        elif abs(got[0] - got[1]) <= 1e-9 * max(scale, 1e-30):
            hint = ("one cost for every tile cannot tell a masked tile from a full one: two stages give two "
                    "equations, solve them for two unknowns")
        else:
            hint = (f"with your (a, b) the model gives {model[0]:.6g} ms for the first stage (measured {x[2]:.6g}) and "
                    f"{model[1]:.6g} ms for the second (measured {y[2]:.6g}): both must match; write the two "
                    "equations full * a + masked * b = latency and solve them (by substitution, Cramer's rule "
                    "or np.linalg.solve)")
        raise _Fail(detail, hint)

    def run_singular(x, y):
        try:
            got = fn(x, y)
        except ValueError:
            return
        except Exception as exc:
            raise _learner_exception("fit_tile_costs", exc, {
                "ZeroDivisionError": "the determinant full_x * masked_y - full_y * masked_x is 0 here: check it "
                                     "first and raise ValueError"}) from None
        raise _Fail(f"fit_tile_costs{(x, y)} returned {_fmt(got)}; expected a ValueError",
                    "these stages' tile counts are proportional, so many (a, b) fit both and the data cannot "
                    "choose: check the determinant full_x * masked_y - full_y * masked_x and raise ValueError "
                    "when it is 0 (np.linalg.solve does not always notice: rounding can leave it a tiny pivot)")

    return _finish("E7 fit_tile_costs", _tile_cost_cases(seed), run,
                   "the case study's stages in both orders, random stages, and two that cannot be fitted")
