"""Splash's computable SVG mask classifies whole blocks from the mask's pair counts (no pair
evaluated) and evaluates only partial blocks: the booleans Splash sees must not change."""
import numpy as np
import pytest

from svg_lib import SVGMask, VideoGeometry
from svg_lib.kernels.splash import _computable_mask


@pytest.mark.parametrize("mask", [SVGMask.spatial(VideoGeometry(5, 6, 10), 0.3),
                                  SVGMask.spatial(VideoGeometry(4, 8, 8), 0.15, first_frame_sink=False)],
                         ids=["with_sink", "no_sink"])
def test_block_classification_gives_the_predicates_booleans(mask):
    calls = []

    def counted(q, k):
        calls.append(np.broadcast(q, k).size)
        return mask.keep(q, k)

    shape = (-(-mask.tokens // 256) * 256,) * 2  # padded to every block size below, as Splash gets it
    fast = _computable_mask(shape, counted, ("fast",), mask)
    slow = _computable_mask(shape, mask.keep, ("slow",))
    whole = 0
    for bq, bkv in ((128, 128), (128, 256), (256, 128)):
        for r in range(0, shape[0], bq):
            for c in range(0, shape[1], bkv):
                idx = (slice(r, r + bq), slice(c, c + bkv))
                before = len(calls)
                got = fast[idx]
                assert np.array_equal(got, slow[idx]), (bq, bkv, r, c)
                whole += len(calls) == before   # answered without evaluating a pair
                assert len(calls) == before or not (got.all() or not got.any()) or r + bq > mask.tokens \
                    or c + bkv > mask.tokens                  # only partial or padded blocks are evaluated
    assert whole > 0
