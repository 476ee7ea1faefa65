"""Radial Attention (Li et al., NeurIPS 2025, arXiv 2506.19852) as a block mask of 128 x 128 tiles.

Radial attention is a static mask whose reach shrinks with the distance between frames: a query
sees its own and the neighbouring frames whole, frames further away only along a diagonal band
whose width halves each time the frame distance doubles, and beyond the point where that band
would be narrower than a tile, only every second, fourth, ... frame (by distance). The pairs kept
then grow as O(n log n) in the frames.

What a kernel computes is not that token-level pattern but its 128 x 128 *block* mask: the
reference (mit-han-lab/radial-attention) builds the token-level pattern one frame pair at a time,
shrinks each to blocks, ORs them into one `[tokens / 128, tokens / 128]` table and runs a
block-sparse kernel over it. So `RadialMask` is that block table (a `TileAlignedMask` of 128 x 128
tiles), computed here in closed form, without building any frame pair's token-level pattern.

The rules, per (query frame i, key frame j) with S tokens per frame and d = |i - j|:

* "wan" only: key frame 0 is a sink, kept whole for every query frame;
* d <= 1: kept whole;
* otherwise, with g = d.bit_length() and base = 2**S.bit_length() / 2**g: the pair is on only if
  base >= 128 or d is a multiple of int(128 / base); when on, query slot r keeps key slot c where
  |c - r| <= max(base * decay_factor, 128).

Shrinking a frame pair's pattern to blocks (the reference's rule): the pattern is laid on the
global 128-token grid (frame i starts (i * S) mod 128 tokens into its first block), and the
ceil(S / 128) x ceil(S / 128) blocks from the frame pair's first block are judged. Within a block,
a key column counts as "dense" if more than 1/3 of the block's 128 rows keep it; the block is kept
when more than 60 % of its columns that keep anything are dense. A frame's rows (or columns) that
spill past those ceil(S / 128) blocks are not judged for that pair. Kept blocks of all frame
pairs are OR-ed. Finally every block row and block column from the one holding the video's last
tokens on (text tokens, which come last) is kept whole.

Where the reference leaves the mask undefined, this one follows the reference's own padded
convention: with tokens not a multiple of 128 its table has floor(tokens / 128) blocks and its
last frame's blocks run past it (at Wan 2.1's 21 x 3,600 = 75,600 tokens it fails on a shape
mismatch); its demo pads the sequence to whole blocks first, which is what is done here: the
table has ceil(tokens / 128) blocks, and the block holding the video's end is kept whole like text.
tests/test_radial.py checks the table against an independent token-level port of the reference's
construction at the Wan 2.1 and HunyuanVideo geometries its scripts run.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import LANES, TileAlignedMask

RADIAL_BLOCK = 128        # the reference's block (its kernels also take 64; its mask is built at 128)
MODELS = ("wan", "hunyuan")


def _frame_pair_rule(distance: int, frame_tokens: int, decay_factor: float):
    """(on, width) for two frames `distance` apart: whether the pair keeps anything, and the band's
    half-width in tokens (None: the whole frame pair)."""
    base = 2 ** frame_tokens.bit_length() / 2 ** distance.bit_length()  # halves as the distance doubles
    on = base >= RADIAL_BLOCK or distance % int(RADIAL_BLOCK / base) == 0  # thinner than a block: every n-th frame
    width = None if distance <= 1 else max(base * decay_factor, RADIAL_BLOCK)
    return on, width


def _overlap(lo, hi, a, b):
    """Length of [lo, hi) intersected with [a, b), elementwise (int arrays broadcast)."""
    return np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None)


def _shrink_frame_pair(frame_tokens: int, row_offset: int, col_offset: int, width):
    """bool `[m, m]`, m = ceil(S / 128): which blocks of one frame pair the reference keeps.

    The pair's rows start `row_offset` tokens into their first block, its columns `col_offset`.
    `width`: the band's half-width (None: every pair of the two frames is kept). Counts, per block
    and key column, the block's rows that keep that column; no token-level pattern is built.
    """
    S, B = frame_tokens, RADIAL_BLOCK
    m = -(-S // B)
    starts = np.arange(m) * B
    r0 = np.clip(starts - row_offset, 0, S)[:, None, None]           # rows of each block row, in the frame
    r1 = np.clip(starts + B - row_offset, 0, S)[:, None, None]
    c = (starts[:, None] + np.arange(B)[None, :] - col_offset)[None]  # [1, m, B]: each block column's key slots
    real_col = (c >= 0) & (c < S)
    if width is None:
        rows = np.broadcast_to(r1 - r0, (m, m, B))
    else:
        reach = int(np.floor(width))                                  # |c - r| <= width, r and c integers
        rows = _overlap(r0, r1, c - reach, c + reach + 1)
    rows = np.where(real_col, rows, 0)                                # [block row, block col, column]
    nonzero = (rows > 0).sum(axis=-1)
    dense = (3 * rows > B).sum(axis=-1)                               # more than 1/3 of the block's rows
    return 5 * dense > 3 * nonzero                                    # more than 60 % of the live columns


def radial_block_mask(geometry: VideoGeometry, model: str = "wan", decay_factor: float = 1.0) -> np.ndarray:
    """bool `[nb, nb]`, nb = ceil(tokens / 128): Radial Attention's block mask (see the module docstring)."""
    S, F, B = geometry.frame_tokens, geometry.frames, RADIAL_BLOCK
    nb = -(-geometry.tokens // B)
    m = -(-S // B)
    kept = np.zeros((nb + m, nb + m), dtype=bool)  # room for a last frame's blocks that run past the end
    cache = {}
    for i in range(F):
        for j in range(F):
            if model == "wan" and j == 0:
                on, width = True, None                                 # the first frame is a sink
            else:
                on, width = _frame_pair_rule(abs(i - j), S, decay_factor)
            if not on:
                continue
            key = (width, (i * S) % B, (j * S) % B)
            if key not in cache:
                cache[key] = _shrink_frame_pair(S, key[1], key[2], width)
            bi, bj = (i * S) // B, (j * S) // B
            kept[bi:bi + m, bj:bj + m] |= cache[key]
    kept = kept[:nb, :nb]
    border = geometry.video_tokens // B                                # text, and the block holding the video's end
    kept[border:, :] = True
    kept[:, border:] = True
    return kept


class RadialMask(TileAlignedMask):
    """Radial Attention's block mask over a frame-major video (text last), as 128 x 128 tiles.

    `model`: "wan" (key frame 0 is an attention sink) or "hunyuan" (no sink). `decay_factor`
    scales the band's width (the reference's scripts use 0.2 for Wan 2.1, 0.95 for HunyuanVideo;
    its default is 1). A `TileAlignedMask`: B3 with 128 x 128 blocks runs it as it is; other blocks
    round it (`tile_aligned`) like any mask.
    """

    def __init__(self, geometry: VideoGeometry, model: str = "wan", decay_factor: float = 1.0):
        if not isinstance(geometry, VideoGeometry):
            raise TypeError(f"geometry must be a VideoGeometry, got {type(geometry).__name__}")
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS} ('wan' keeps the first frame as a sink), got {model!r}")
        if isinstance(decay_factor, bool) or not isinstance(decay_factor, (int, float)) or not decay_factor > 0:
            raise ValueError(f"decay_factor must be a positive number (the reference uses 0.2 to 1), "
                             f"got {decay_factor!r}")
        self.geometry, self.model, self.decay_factor = geometry, model, float(decay_factor)
        super().__init__(geometry.tokens, LANES, LANES, radial_block_mask(geometry, model, self.decay_factor))

    def __repr__(self) -> str:
        return (f"RadialMask({self.geometry}, model={self.model!r}, decay_factor={self.decay_factor}, "
                f"kept {int(self.kept.sum())}/{self.kept.size} blocks of 128)")
