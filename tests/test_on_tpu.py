"""What only a real TPU can show: the kernels compiled by Mosaic and run on the chip (`pytest -m tpu`).

Everywhere else these skip (tests/conftest.py): CI has no TPU. The rest of the suite runs compiled
on a TPU too (`interpret=None` compiles there); these add the sizes where the compiled program once
went wrong while both interpreters were right: a last query and key tile that reach past the array's
end, in float32 and bfloat16, at small tiles (the kernels then cleared the partial tail in place,
which corrupted other rows of the state on a v5e; svg_lib/kernels/forward.py says more).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import SVGMask, VideoGeometry, attention, b3_mask
from svg_lib.extensions.references import attention_float64

from helpers import method_tolerance, random_qkv

pytestmark = pytest.mark.tpu

# the walkthrough's geometry: 2,520 tokens, partial last tiles at every size below
GEOMETRY = VideoGeometry(21, 8, 15)
MASK = SVGMask.spatial(GEOMETRY, 0.35)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("blocks", [(256, 128, 128), (128, 256, 128), (512, 512, 256), (256, 512, 128),
                                    (256, 768, 128)])  # the last two: key-slice loops unrolled 2 of 4, 3 of 6
@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3"])
def test_every_row_is_right_with_partial_last_tiles(method, blocks, dtype):
    block_q, block_kv, block_kv_compute = blocks
    assert jax.devices()[0].platform == "tpu"
    q, k, v = random_qkv(5, 2, GEOMETRY.tokens, 128, dtype)
    got = np.asarray(jnp.asarray(attention(q, k, v, MASK, method=method, block_q=block_q, block_kv=block_kv,
                                           block_kv_compute=block_kv_compute), jnp.float32), np.float64)
    mask = None if method == "dense" else (b3_mask(MASK, block_q, block_kv) if method == "b3" else MASK)
    want = attention_float64(q, k, v, None if mask is None else mask.to_dense())
    tol = method_tolerance(method, dtype)
    wrong = np.nonzero((np.abs(got - want) > tol["atol"] + tol["rtol"] * np.abs(want)).any(axis=(0, 2)))[0]
    assert wrong.size == 0, f"{method} {blocks} {dtype}: {wrong.size} wrong rows, first {wrong[:8].tolist()}"
