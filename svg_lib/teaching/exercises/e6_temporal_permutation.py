"""E6, the temporal-major permutation: `check_temporal_permutation` and its hidden cases.

The reference is `temporal_major_permutation`."""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry, temporal_major_permutation
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt


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
