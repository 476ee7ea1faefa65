"""3-D sliding tiles: a mask that is tile-aligned by construction.

`SlidingTileMask` orders the video's tokens tile-major (`core.geometry.TileLayout`: each cube
of frames x rows x columns contiguous) and lets each query cube attend a window of whole key
cubes around it. When the kernel's blocks divide a cube's token count, every tile of the
attention grid is entirely kept or entirely skipped, so only the tiles holding padded keys need
a mask (see the class docstring).
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.extensions.tile_layout import TileLayout, inverse_tile_major_permutation, tile_major_permutation
from svg_lib.core.masks import Mask, _check_policy, _grid_cells, _is_numpy, check_block_size
from svg_lib.core.svg_masks import PermutedMask


class SlidingTileMask(Mask):
    """Sliding tile attention: each query cube attends to a window of whole cubes (tile-major order).

    Tokens are in the order of `TileLayout(geometry, tile)` (see `to_tile_major`): each
    `tile = (tt, th, tw)` cube of the latent video is contiguous, padding positions included,
    text tokens last. A video query in cube (a_t, a_h, a_w) keeps the video keys of the
    `window = (wt, wh, ww)` cubes around it (odd counts, in cubes per dimension); text rows and
    columns are always kept; padding positions are never kept, as keys or as queries, and
    `real_tokens_in` declares them, so the planner masks tiles for padded keys only (padded query
    rows are computed and thrown away).

    Edges: the window is *shifted inside* the video (as neighbourhood attention does), not
    clipped. Along a dimension of n cubes it covers cubes [s, s + w) with
    s = clip(a - w // 2, 0, n - w) (the whole dimension when w >= n). So every query cube visits
    the same number of key cubes: a TPU grid pads every query tile's schedule to the longest
    one, so clipped windows would leave edge tiles idle steps that still cost grid overhead, and
    would give edge tokens less context than the middle ones for the same budget.

    When `block_q` and `block_kv` divide the cube's token count, every attention tile lies in
    one (query cube, key cube) pair, so it is entirely kept or entirely skipped: only tiles
    holding padded keys are partial, and B3 runs the mask as it is (`tile_aligned` returns it).
    """

    def __init__(self, geometry: VideoGeometry, tile, window):
        self.layout = TileLayout(geometry, tile)
        self.geometry = geometry
        self.tile = self.layout.tile
        win = tuple(window) if isinstance(window, (tuple, list)) else None
        if win is None or len(win) != 3 or any(isinstance(w, bool) or not isinstance(w, (int, np.integer))
                                               or w < 1 or w % 2 == 0 for w in win):
            raise ValueError(f"window must be 3 odd positive integers (cubes per dimension, centred on the "
                             f"query's cube), e.g. (3, 3, 3); got {window!r}")
        self.window = tuple(int(w) for w in win)
        self.tokens = self.layout.tokens

    def cache_key(self):
        return type(self), self.geometry, self.tile, self.window

    # -- coordinates (numpy, or jax with truncating div/rem that Mosaic lowers anywhere) -------
    def _divmod(self, i, d):
        if _is_numpy(i):
            return i // d, i % d
        import jax
        return jax.lax.div(i, d), jax.lax.rem(i, d)

    def _cube_and_real(self, i):
        """(cube coordinates (ct, ch, cw), is a real video token, is a text token) of positions i."""
        layout, (tt, th, tw) = self.layout, self.tile
        F, H, W = layout.dims
        _, nh, nw = layout.cubes
        cube, inner = self._divmod(i, layout.cube_tokens)
        ct, rest = self._divmod(cube, nh * nw)
        ch, cw = self._divmod(rest, nw)
        rt, rest = self._divmod(inner, th * tw)
        rh, rw = self._divmod(rest, tw)
        video = i < layout.video_tokens
        real = video & (ct * tt + rt < F) & (ch * th + rh < H) & (cw * tw + rw < W)
        text = ~video & (i < self.tokens) if not _is_numpy(i) else (i >= layout.video_tokens) & (i < self.tokens)
        return (ct, ch, cw), real, text

    def _window_start(self, a, n, w):
        lo, hi = 0, max(n - w, 0)
        if _is_numpy(a):
            return np.clip(a - w // 2, lo, hi)
        import jax.numpy as jnp
        return jnp.minimum(jnp.maximum(a - w // 2, lo), hi)

    def keep(self, q, k):
        cq, real_q, text_q = self._cube_and_real(q)
        ck, real_k, text_k = self._cube_and_real(k)
        inside = True
        for a, b, n, w in zip(cq, ck, self.layout.cubes, self.window):
            start = self._window_start(a, n, w)
            inside = inside & (b >= start) & (b < start + w)
        return (real_q | text_q) & (real_k | text_k) & (inside | text_q | text_k)

    @property
    def pair_density(self) -> float:
        """Fraction of the *real* token pairs kept: pair_count / geometry.tokens**2.

        Padding positions are never kept, so dividing by the padded sequence's tokens**2 would
        understate the budget; this is the number to set beside an SVG mask's pair_density.
        """
        return self.pair_count / float(self.geometry.tokens) ** 2

    # -- structure -------------------------------------------------------------------------
    def aligned(self, block_q: int, block_kv: int) -> bool:
        """Whether `block_q` and `block_kv` divide the cube: then every tile is kept or skipped whole."""
        return self.layout.cube_tokens % block_q == 0 and self.layout.cube_tokens % block_kv == 0

    def kernel_predicate(self, block_q: int, block_kv: int):
        if not self.aligned(block_q, block_kv):
            return self.keep
        cube_and_real = self._cube_and_real

        def real_keys(q, k):
            # Visited aligned tiles lie inside the window, so only padded keys are masked. Padded
            # query rows are computed and thrown away (real_tokens_in declares them), and a
            # predicate on keys alone costs the kernel one row of work, not a tile.
            _, real_k, text_k = cube_and_real(k)
            return real_k | text_k
        return real_keys

    def tile_aligned(self, block_q: int, block_kv: int, policy: str = "balanced") -> Mask:
        """B3's rounding: nothing to round when the blocks divide the cube, so the mask itself.

        With other blocks and no padding, tiles are rounded as for any mask. With padding and
        blocks that do not divide the cube, rounding would keep padding keys whole in some tiles
        (they would enter the softmax) or drop real pairs to avoid them: refused.
        """
        block_q = check_block_size("block_q", block_q)
        block_kv = check_block_size("block_kv", block_kv)
        _check_policy(policy)
        if self.aligned(block_q, block_kv):
            return self
        if self.layout.padding_tokens == 0:
            return super().tile_aligned(block_q, block_kv, policy)
        raise ValueError(f"{block_q}x{block_kv} blocks do not divide the {self.layout.cube_tokens}-token cube of "
                         f"{self.layout}, and rounding tiles that hold padding would let padding keys into the "
                         f"softmax. Use blocks that divide {self.layout.cube_tokens}, or method 'b2'")

    def _real_prefix(self, cube, r):
        """Real video tokens among the first `r` positions of cube `cube` (int64 arrays, broadcasting)."""
        (tt, th, tw), (F, H, W) = self.tile, self.layout.dims
        _, nh, nw = self.layout.cubes
        ct, ch, cw = cube // (nh * nw), cube // nw % nh, cube % nw
        et, eh, ew = (np.clip(d - c * t, 0, t) for d, c, t in ((F, ct, tt), (H, ch, th), (W, cw, tw)))
        rt, rh, rw = r // (th * tw), r // tw % th, r % tw
        return np.minimum(rt, et) * eh * ew + (rt < et) * (np.minimum(rh, eh) * ew + (rh < eh) * np.minimum(rw, ew))

    def _real_upto(self, x):
        """Real tokens among tile-major positions [0, x) (int64 array x, any position up to `tokens`)."""
        vc, vp = self.layout.cube_tokens, self.layout.video_tokens
        cubes = np.arange(self.layout.num_cubes + 1, dtype=np.int64)  # one past the end: no real tokens
        real_before = np.concatenate([[0], np.cumsum(self._real_prefix(cubes, vc))])
        video = np.minimum(x, vp)
        c = video // vc
        return real_before[c] + self._real_prefix(c, video - c * vc) + np.maximum(x, vp) - vp  # + text

    def real_tokens_in(self, edges) -> np.ndarray:
        """Real tokens per grid cell: video tokens and text, not the padding that fills the cubes."""
        c0, c1 = _grid_cells(edges, self.tokens)
        return self._real_upto(c1) - self._real_upto(c0)

    def _window_matrix(self, n, w):
        a = np.arange(n)
        start = np.clip(a - w // 2, 0, max(n - w, 0))
        return ((a[None, :] >= start[:, None]) & (a[None, :] < start[:, None] + w)).astype(np.int64)

    def pair_counts(self, q_edges, k_edges) -> np.ndarray:
        # Closed form. Per key cell j, T[c, j] = real keys of cell j inside query cube c's window:
        # the real keys per (cube, cell) with the window applied one dimension at a time (it is a
        # product of 1-D windows). A query range [x0, x1) then keeps H(x1) - H(x0), where
        # H(x) = sum of T[cube(t), j] over real tokens t < x: whole cubes by a cumulative sum,
        # the cube x falls in by its real-token prefix. No token pair is visited.
        layout, n = self.layout, self.tokens
        vc, nc, vp = layout.cube_tokens, layout.num_cubes, layout.video_tokens
        q0, q1 = _grid_cells(q_edges, n)
        k0, k1 = _grid_cells(k_edges, n)
        cubes = np.arange(nc + 1, dtype=np.int64)  # one past the end: a cube with no real tokens
        real = self._real_prefix(cubes, vc)

        vq0, vq1 = np.minimum(q0, vp), np.minimum(q1, vp)
        vk0, vk1 = np.minimum(k0, vp), np.minimum(k1, vp)
        windows = [self._window_matrix(c, w) for c, w in zip(layout.cubes, self.window)]
        video = np.zeros((q0.size, k0.size), dtype=np.int64)
        cq0, cq1 = vq0 // vc, vq1 // vc
        chunk = max(1, 2_000_000 // (nc + 1))
        for start in range(0, k0.size, chunk):
            cols = slice(start, start + chunk)
            c = cubes[:nc, None]
            keys = (self._real_prefix(c, np.clip(vk1[None, cols] - c * vc, 0, vc))
                    - self._real_prefix(c, np.clip(vk0[None, cols] - c * vc, 0, vc)))  # [cubes, cells]
            t = keys.reshape(*layout.cubes, -1)
            t = np.einsum("ad,dbcj->abcj", windows[0], t)
            t = np.einsum("be,aecj->abcj", windows[1], t)
            t = np.einsum("cf,abfj->abcj", windows[2], t).reshape(nc, -1)
            t = np.concatenate([t, np.zeros((1, t.shape[1]), np.int64)])  # the empty cube past the end
            cum = np.concatenate([np.zeros((1, t.shape[1]), np.int64), np.cumsum(real[:, None] * t, axis=0)])

            def weighted(x, c):  # H(x) for every query edge x (cube c = x // vc) and key cell
                return cum[c] + self._real_prefix(c, x - c * vc)[:, None] * t[c]
            video[:, cols] = weighted(vq1, cq1) - weighted(vq0, cq0)
        real_q, real_k = self._real_upto(vq1) - self._real_upto(vq0), self._real_upto(vk1) - self._real_upto(vk0)
        text_q = np.maximum(q1, vp) - np.maximum(q0, vp)
        text_k = np.maximum(k1, vp) - np.maximum(k0, vp)
        return video + text_q[:, None] * (real_k + text_k)[None, :] + real_q[:, None] * text_k[None, :]

    def frame_major(self) -> "PermutedMask":
        """The same mask over the geometry's frame-major tokens (padding gone), for recall and plots.

        A table-driven view (`PermutedMask`): kernels run the tile-major mask on permuted tokens.
        """
        view = PermutedMask(self, inverse_tile_major_permutation(self.geometry, self.tile),
                            tile_major_permutation(self.geometry, self.tile))
        view.tokens = self.geometry.tokens
        return view

    def __repr__(self) -> str:
        return (f"SlidingTileMask({self.geometry}, tile={self.tile}, window={self.window}, "
                f"pair_density={self.pair_density:.4f})")
