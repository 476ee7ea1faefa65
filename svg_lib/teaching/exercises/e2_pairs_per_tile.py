"""E2, kept pairs of a band in one tile: `check_band_pair_count` and its hidden cases.

The reference is the masks' closed-form pair count (`svg_lib.core.svg_masks._band_pairs`)."""
from __future__ import annotations

import numbers
import time

import numpy as np

from svg_lib.core.svg_masks import _band_pairs
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish


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
