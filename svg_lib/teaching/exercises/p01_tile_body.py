"""Notebook 01's your-code piece, the online-softmax tile body on refs inside svg_lib's own kernel:
`flash_attention_with_body` (the kernel with the learner's tile body plugged in), `check_tile_body_on_refs`,
its hidden cases and hints, and svg_lib's own body (`tile_body`, what the notebook runs until the
learner's passes).

The reference is svg_lib's float64 attention (`attention_float64`); a failing output is compared
with the same kernel simulated in float64 with one typical mistake each, to name the mistake.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from svg_lib.core.planner import FULL, PARTIAL, pack_schedule
from svg_lib.kernels.forward import MASK_VALUE
from svg_lib.kernels.grid import Pieces
from svg_lib.extensions.references import attention_float64
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt
from svg_lib.teaching.exercises.plugged import plugged_attention, tile_body_piece
from svg_lib.teaching.yourcode import Hints


def tile_body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):
    """svg_lib's piece: fold one key tile into a query tile's running (m, l, acc) (see the notebook)."""
    import jax.numpy as jnp

    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)  # [block_q, block_kv]
    if keep is not None:
        s = jnp.where(keep, s, MASK_VALUE)
    m_prev = m_ref[...]                                                         # [block_q, 1]
    m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next)
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                  preferred_element_type=jnp.float32)
    m_ref[...] = m_next


SOLUTION = '''\
def tile_body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):
    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)  # [block_q, block_kv]
    if keep is not None:
        s = jnp.where(keep, s, MASK_VALUE)
    m_prev = m_ref[...]
    m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))   # the running max, not the tile's
    alpha = jnp.exp(m_prev - m_next)                              # old max -> new max
    p = jnp.exp(s - m_next)
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                  preferred_element_type=jnp.float32)
    m_ref[...] = m_next
'''

HINTS = Hints("the tile body", (
    "Read the blocks with q_ref[...], k_ref[...], v_ref[...] and the state with m_ref[...], l_ref[...], "
    "acc_ref[...]; write the new state back with m_ref[...] = ... (all three: the next tile reads them).",
    "s = q @ k.T ([block_q, block_kv], float32: jnp.dot(..., preferred_element_type=jnp.float32)); where "
    "keep is not None, masked scores become MASK_VALUE (jnp.where), the finite stand-in for -inf of section 2.",
    "The new max is the running one: m_next = max(m_prev, the tile's row max). alpha = exp(m_prev - m_next) "
    "moves l and acc, measured against m_prev, to m_next: multiply each once, then add this tile's p = "
    "exp(s - m_next) (its row sums to l, p @ v to acc).",
), SOLUTION)


@dataclasses.dataclass(frozen=True)
class _EveryTile:
    """A plan that visits every (query tile, key tile) in order (dense attention as a schedule): the
    fields of `planner.TilePlan` that `plugged_attention` reads."""

    kv_index: np.ndarray
    schedule: np.ndarray
    block_q: int
    block_kv: int


def flash_attention_with_body(q, k, v, body, *, block_q: int, block_kv: int, keep=None, interpret=True,
                              pad_value: float = 0.0):
    """Dense flash attention whose tile body is `body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep)`:
    svg_lib's B2 kernel (`forward.block_sparse_attention`, built by `grid.tile_step_call`) over a
    schedule that visits every key tile of every query tile, with `body` in place of its own (`plugged`).

    q, k, v `[heads, tokens, head_dim]` (unscaled; q is scaled by 1/sqrt(head_dim) here, in its dtype),
    padded to whole tiles with `pad_value`. Scratch: m and l `[block_q, 1]` float32 (as the body sees
    them), acc `[block_q, head_dim]` float32, set to (MASK_VALUE, 0, 0) at each query tile's first key
    tile and turned into the output (acc / l; zeros for a row that kept no key) at its last. The body gets
    `keep=None` on tiles with nothing to mask, else a bool `[block_q, block_kv]`: the key padding
    (`k < tokens`) and, if given, the predicate `keep(q_ids, k_ids)` on global token indices (q_ids
    `[block_q, 1]`, k_ids `[1, block_kv]`).
    """
    import jax.numpy as jnp

    heads, tokens, head_dim = q.shape
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    kv_index = np.broadcast_to(np.arange(nk), (nq, nk))
    # a tile masks where a predicate is given, or where it reaches into key padding; the rest are FULL
    masked = np.broadcast_to(keep is not None or np.arange(1, nk + 1) * block_kv > tokens, (nq, nk))
    plan = _EveryTile(kv_index, pack_schedule(kv_index, np.where(masked, PARTIAL, FULL)), block_q, block_kv)

    def in_keys(q_ids, k_ids):
        return k_ids < tokens if keep is None else (k_ids < tokens) & keep(q_ids, k_ids)

    def pad(x, n):
        return jnp.pad(x, ((0, 0), (0, n - tokens), (0, 0)), constant_values=pad_value)

    out = plugged_attention(pad(q, nq * block_q), pad(k, nk * block_kv), pad(v, nk * block_kv), plan, stage="b2",
                            keep=in_keys, pieces=Pieces(body=tile_body_piece(body)), interpret=interpret)
    return out[:, :tokens]


# -- the kernel in float64, with one typical mistake at a time -----------------------------------

def _simulate(q, k, v, keep, block_q, block_kv, masked, mistake=None):
    """The kernel above in float64 NumPy for one head: q, k, v `[tokens, d]` padded to whole tiles
    (q pre-scaled), keep bool `[q slots, k slots]` (padding included), masked bool `[key tiles]`: the
    tiles whose body gets `keep` (the others get None). `mistake` switches one step."""
    nq, nk = q.shape[0] // block_q, k.shape[0] // block_kv
    out = np.zeros((q.shape[0], v.shape[1]))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for i in range(nq):
            rows = slice(i * block_q, (i + 1) * block_q)
            m, l, acc = np.full((block_q, 1), MASK_VALUE), np.zeros((block_q, 1)), np.zeros((block_q, v.shape[1]))
            for j in range(nk):
                cols = slice(j * block_kv, (j + 1) * block_kv)
                s = q[rows] @ k[cols].T
                if mistake == "scaled_again":
                    s = s / math.sqrt(q.shape[1])
                if mistake == "keep_swapped" and masked[j]:
                    s = np.where(keep[rows, cols], MASK_VALUE, s)
                elif mistake != "no_keep" and masked[j]:
                    s = np.where(keep[rows, cols], s, 0.0 if mistake == "masked_zero" else MASK_VALUE)
                tile_max = s.max(axis=1, keepdims=True)
                m_next = tile_max if mistake == "tile_max" else np.maximum(m, tile_max)
                alpha = (1.0 if mistake == "m_read_after_write" else
                         np.exp(m_next - m) if mistake == "alpha_flipped" else np.exp(m - m_next))
                if mistake == "no_max":
                    m_next, alpha = np.maximum(m, tile_max), 1.0
                p = np.exp(s - (0.0 if mistake == "no_max" else m if mistake == "p_old_max" else m_next))
                if mistake != "l_not_stored":
                    l = (alpha * alpha if mistake == "l_twice" else 1.0 if mistake == "l_not_rescaled" else alpha) * l \
                        + p.sum(axis=1, keepdims=True)
                if mistake != "acc_not_stored":
                    acc = (1.0 if mistake == "acc_not_rescaled" else alpha) * acc + p @ v[cols]
                if mistake != "m_not_stored":
                    m = m_next
            seen = m > 0.5 * MASK_VALUE
            out[rows] = np.where(seen, acc / np.where(seen, l, 1.0), 0.0)
    return out


OVERFLOW = ("exp overflowed: subtract the running max, m_next = max(m_prev, the tile's max), from the scores and "
            "from m_prev; the tile's own max is not enough when it falls below m_prev, exp(m_prev - tile max) overflows")
NOT_STORED = ("the rows came out 0: part of the state was never written back. Store all three after the update: "
              "m_ref[...] = m_next (else the next tile starts from the old max, alpha wipes out everything folded "
              "so far, and finish takes the row for one that kept no key), l_ref[...] = ... and "
              "acc_ref[...] = alpha * acc + p @ v")
_MISTAKES = {
    "acc_not_rescaled": "acc was not rescaled: when a row's max rises, multiply acc by alpha = exp(m_prev - m_next) "
                        "before adding this tile's p @ v",
    "l_not_rescaled": "l was not rescaled: multiply l by alpha = exp(m_prev - m_next) before adding this tile's row sums",
    "l_twice": "l was rescaled twice (alpha * alpha * l): multiply it by alpha once per tile",
    "m_not_stored": NOT_STORED,
    "no_keep": "masked pairs counted: where keep is given, masked scores must become MASK_VALUE before the max and exp",
    "masked_zero": ("masked scores were set to 0, which still counts them: exp(0 - m) is not 0. Give them MASK_VALUE, "
                    "the finite stand-in for -inf, so that exp sends them to exactly 0"),
    "m_read_after_write": ("alpha came out 1 on every tile: m_ref was written before alpha read it. Keep the old max, "
                           "m_prev = m_ref[...], compute alpha = exp(m_prev - m_next) from it, and store m_ref[...] = "
                           "m_next last"),
    "scaled_again": "q arrives already scaled by 1/sqrt(head_dim): the scores are exactly q @ k.T",
    # before the mistakes below: where an overflow explains a nan, it is named first
    "tile_max": OVERFLOW,
    "no_max": OVERFLOW,
    "acc_not_stored": NOT_STORED,   # the same zeros as m never stored: one message names both
    "l_not_stored": ("l was never written back (it stays 0, so finish's acc / l is inf): after the update, "
                     "l_ref[...] = alpha * l + p.sum(axis=1, keepdims=True)"),
    "keep_swapped": ("the kept pairs were masked and the masked ones kept: keep is True where a pair is kept, so "
                     "jnp.where(keep, s, MASK_VALUE)"),
    "p_old_max": ("p was measured against the old max: p = exp(s - m_next), the max after this tile, as l and "
                  "acc are moved to it by alpha"),
    "alpha_flipped": ("alpha is upside down: it moves l and acc from the old max down to the new one, "
                      "alpha = exp(m_prev - m_next), at most 1"),
}


def _cases(seed: int) -> list[_Case]:
    rng = np.random.default_rng(seed)
    d = 16  # 1/sqrt(16) = 0.25 keeps bf16 values bf16 after scaling, so q @ k.T is exact on every backend

    def bf16(x):
        import ml_dtypes

        return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)

    def normal(n, scale=1.0):
        return bf16(rng.standard_normal((n, d)) * scale)

    def case(name, n, bq, bkv, q, k, v, keep=None, keep_text=""):
        return _Case(name, dict(tokens=n, block_q=bq, block_kv=bkv, q=q, k=k, v=v, keep=keep, keep_text=keep_text))

    cases = [case("one query tile of 8 rows, one key tile of 8 keys", 8, 8, 8, normal(8), normal(8), normal(8))]
    qp = bf16(np.abs(rng.standard_normal((32, d))) + 0.25)
    # each tile's scores about one unit above the last: alpha = exp(m_prev - m_next) well inside (0, 1)
    rising = np.concatenate([bf16(np.abs(rng.standard_normal((8, d))) * 0.5 + 0.25 * t) for t in range(4)])
    cases.append(case("one query tile of 8 rows reads 4 key tiles, each raising its max (the state must be rescaled)", 32, 32, 8,
                      qp, rising, normal(32)))
    big = np.concatenate([normal(8, 60.0) * (1 if t % 2 == 0 else 0.01) for t in range(4)])
    cases.append(case("scores near 1e4, the tile max falling and rising from tile to tile", 32, 32, 8,
                      normal(32, 60.0), bf16(big), normal(32)))
    cases.append(case("key tile 0 fully masked for every row (keep: k >= 8), and row 3 keeps no key at all", 24, 8, 8,
                      normal(24), normal(24), normal(24), lambda qi, ki: (ki >= 8) & (qi != 3), "k >= 8 and q != 3"))
    const = np.full((20, d), 0.5, np.float32)
    cases.append(case("constant tokens (every score equal) and 4 padded keys", 20, 8, 8, const, const.copy(),
                      normal(20)))
    cases.append(case("2 query tiles x 3 key tiles, a band |q - k| <= 5, key padding holding garbage", 22, 16, 8,
                      normal(22), normal(22), normal(22), lambda qi, ki: abs(qi - ki) <= 5, "|q - k| <= 5"))
    for r in range(2):
        n = int(rng.integers(17, 40))
        cases.append(case(f"random: {n} tokens in tiles of 8 x 16", n, 8, 16, normal(n), normal(n, 2.0), normal(n)))
    return cases


def check_tile_body_on_refs(fn, *, seed: int = 0) -> CheckResult:
    """Notebook 01: `fn(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep)` is the tile body of
    `flash_attention_with_body`, run in interpret mode on each hidden case and compared with float64
    attention; the first wrong output is matched against the kernel simulated with typical mistakes."""
    import jax.numpy as jnp

    def run(case):
        c = case.data
        n, bq, bkv = c["tokens"], c["block_q"], c["block_kv"]
        pad_value = 30.0  # padded keys and values hold large garbage: an unmasked one shows
        out = _call(flash_attention_with_body, "the kernel with your tile body",
                    *(jnp.asarray(x[None]) for x in (c["q"], c["k"], c["v"])), fn, block_q=bq, block_kv=bkv,
                    keep=c["keep"], interpret=True, pad_value=pad_value,
                    hints={"TracerBool": "keep is a traced array: use jnp.where(keep, s, MASK_VALUE), not a Python if "
                                         "on its values (`if keep is not None` is fine)",
                           "TracerArrayConversion": "a traced value went to NumPy: inside a kernel body use jax.numpy "
                                                    "(jnp.exp, jnp.dot, jnp.where), not np",
                           "Invalid shape for `swap`": "a value's shape does not fit its ref: m_ref and l_ref hold one "
                                                       "number per query row, [block_q, 1], so the row max and row sum "
                                                       "run over the keys, axis=1 with keepdims=True (axis=0 runs over "
                                                       "the queries)"})
        got = np.asarray(out, np.float64)[0]
        ids = np.arange(n)
        keep = np.ones((n, n), bool) if c["keep"] is None else np.asarray(c["keep"](ids[:, None], ids[None, :]), bool)
        want = attention_float64(c["q"][None], c["k"][None], c["v"][None], keep)[0]
        atol = 1e-2 * max(1.0, float(np.abs(c["v"]).max()))
        if np.allclose(got, want, rtol=1e-2, atol=atol):
            return
        qs = np.zeros((-(-n // bq) * bq, c["q"].shape[1]))
        qs[:n] = c["q"] * (1.0 / math.sqrt(c["q"].shape[1]))
        slots = -(-n // bkv) * bkv
        k = np.full((slots, c["k"].shape[1]), pad_value)
        v = np.full((slots, c["v"].shape[1]), pad_value)
        k[:n], v[:n] = c["k"], c["v"]
        full = np.zeros((qs.shape[0], slots), bool)
        full[:n, :n] = keep
        masked = (c["keep"] is not None) | (np.arange(1, slots // bkv + 1) * bkv > n)  # as the kernel's plan
        named = list(dict.fromkeys(    # inf and nan where the mistake puts them too
            text for mistake, text in _MISTAKES.items()
            if np.allclose(got, _simulate(qs, k, v, full, bq, bkv, masked, mistake)[:n], rtol=1e-2, atol=atol,
                           equal_nan=True)))
        # an output all nan can come from more than one mistake: name each that gives it
        named = "\n  or: ".join(named) if named else None
        if not np.all(np.isfinite(got)) and named is None:
            row = int(np.flatnonzero(~np.isfinite(got).all(axis=1))[0])
            if c["keep"] is not None and not keep[row, :bkv].any():
                hint = ("a tile that masks all of a row's keys: with -inf for masked scores, exp(-inf - (-inf)) is nan; "
                        "give masked scores MASK_VALUE, a finite number, as the kernels do")
            else:
                hint = OVERFLOW
            raise _Fail(f"row {row} of the output is not finite: {_fmt(got[row])}", hint)
        hint = named or "acc / l must be softmax attention over the kept keys: compare your update with section 2's numpy"
        bad = ~np.isclose(got, want, rtol=1e-2, atol=atol)
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        raise _Fail(f"output row {row}: expected {_fmt(want[row])}, got {_fmt(got[row])}", hint)

    return _finish("the tile body", _cases(seed), run,
                   "one and several key tiles, a rising max, scores near 1e4, fully masked tiles and rows, constant "
                   "tokens, key padding holding garbage, random sizes; against float64 attention")
