"""3-D tiles of the video (notebook 10's sliding tiles): cubes of latent frames x rows x columns
and the tile-major token order, a permutation of the frame-major order of `core.geometry`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.extensions.token_order import _check_tokens

@dataclass(frozen=True)
class TileLayout:
    """The video cut into `tile = (tt, th, tw)` cubes of latent frames x rows x columns.

    Latent dimensions that are not multiples of the tile are padded up to whole cubes. In
    tile-major order the cube's `tt * th * tw` tokens are contiguous (raster order inside the
    cube) and the cubes follow in raster order (frames, rows, columns); padding tokens sit where
    the padded positions fall, and the text tokens follow all cubes.

    >>> layout = TileLayout(VideoGeometry(21, 45, 80), (3, 8, 16))
    >>> layout.cubes, layout.cube_tokens, layout.tokens, layout.padding_tokens
    ((7, 6, 5), 384, 80640, 5040)
    """

    geometry: VideoGeometry
    tile: tuple

    def __post_init__(self):
        if not isinstance(self.geometry, VideoGeometry):
            raise TypeError(f"geometry must be a VideoGeometry, got {type(self.geometry).__name__}")
        tile = tuple(self.tile) if isinstance(self.tile, (tuple, list)) else None
        if tile is None or len(tile) != 3 or any(isinstance(t, bool) or not isinstance(t, (int, np.integer))
                                                 or t < 1 for t in tile):
            raise ValueError(f"tile must be 3 positive integers (frames, rows, cols) per cube, got {self.tile!r}")
        object.__setattr__(self, "tile", tuple(int(t) for t in tile))

    @property
    def dims(self) -> tuple:
        """(F, H, W): the latent video's frames, rows, columns."""
        return self.geometry.frames, self.geometry.height, self.geometry.width

    @property
    def cubes(self) -> tuple:
        """Cubes per dimension: (ceil(F / tt), ceil(H / th), ceil(W / tw))."""
        return tuple(-(-d // t) for d, t in zip(self.dims, self.tile))

    @property
    def num_cubes(self) -> int:
        return int(np.prod(self.cubes))

    @property
    def cube_tokens(self) -> int:
        """Tokens per cube, tt * th * tw (padding positions included)."""
        return int(np.prod(self.tile))

    @property
    def video_tokens(self) -> int:
        """Video positions in tile-major order, padding included: num_cubes * cube_tokens."""
        return self.num_cubes * self.cube_tokens

    @property
    def tokens(self) -> int:
        """The tile-major sequence length: padded video positions + text tokens."""
        return self.video_tokens + self.geometry.text_tokens

    @property
    def padding_tokens(self) -> int:
        return self.video_tokens - self.geometry.video_tokens

    @property
    def padding_overhead(self) -> float:
        """Padding positions per real video token (0.0 when the tile divides the video)."""
        return self.padding_tokens / self.geometry.video_tokens

    def coordinates(self, j):
        """(frame, row, col, cube_t, cube_h, cube_w) of tile-major video positions `j` (numpy ints)."""
        j = np.asarray(j, dtype=np.int64)
        tt, th, tw = self.tile
        _, nh, nw = self.cubes
        cube, inner = j // self.cube_tokens, j % self.cube_tokens
        ct, ch, cw = cube // (nh * nw), cube // nw % nh, cube % nw
        rt, rh, rw = inner // (th * tw), inner // tw % th, inner % tw
        return ct * tt + rt, ch * th + rh, cw * tw + rw, ct, ch, cw

    def __str__(self) -> str:
        return (f"{'x'.join(map(str, self.tile))} cubes ({self.cube_tokens} tokens), "
                f"{'x'.join(map(str, self.cubes))} of them: {self.tokens:,} tokens, "
                f"{self.padding_tokens:,} padding ({self.padding_overhead:.2%})")


def tile_major_permutation(geometry: VideoGeometry, tile) -> np.ndarray:
    """Gather indices `perm` [layout.tokens] with `x_tile = x_ext[perm]`, x_ext = x + one zero row.

    Position j holds frame-major token perm[j]; padding positions hold `geometry.tokens`, the
    index of the zero row appended by `to_tile_major` (so padding q, k, v are zeros). Text
    tokens follow the cubes in their own order.
    """
    layout = TileLayout(geometry, tile)
    F, H, W = layout.dims
    frame, row, col, *_ = layout.coordinates(np.arange(layout.video_tokens))
    real = (frame < F) & (row < H) & (col < W)
    video = np.where(real, (frame * H + row) * W + col, geometry.tokens)
    return np.concatenate([video, np.arange(geometry.video_tokens, geometry.tokens, dtype=np.int64)])


def inverse_tile_major_permutation(geometry: VideoGeometry, tile) -> np.ndarray:
    """Gather indices `inv` [geometry.tokens] with `x_frame_major = x_tile[inv]` (padding dropped)."""
    perm = tile_major_permutation(geometry, tile)
    inv = np.empty(geometry.tokens, dtype=np.int64)
    real = np.flatnonzero(perm < geometry.tokens)
    inv[perm[real]] = real
    return inv


def to_tile_major(x, geometry: VideoGeometry, tile, axis: int = -2):
    """`[heads, tokens, head_dim]` (numpy or jax) from frame-major to tile-major order, zero-padded.

    The result has `TileLayout(geometry, tile).tokens` tokens on `axis`; padding positions are zeros.
    """
    _check_tokens(x, geometry, axis)
    axis = axis % x.ndim
    shape = list(x.shape)
    shape[axis] = 1
    if isinstance(x, np.ndarray):
        extended = np.concatenate([x, np.zeros(shape, dtype=x.dtype)], axis=axis)
    else:
        import jax.numpy as jnp
        extended = jnp.concatenate([x, jnp.zeros(shape, dtype=x.dtype)], axis=axis)
    return extended.take(tile_major_permutation(geometry, tile), axis=axis)


def from_tile_major(x, geometry: VideoGeometry, tile, axis: int = -2):
    """Undo `to_tile_major`: `[heads, layout.tokens, head_dim]` back to frame-major, padding dropped."""
    layout = TileLayout(geometry, tile)
    if x.ndim < 2 or x.shape[axis] != layout.tokens:
        raise ValueError(f"expected an array shaped [heads, {layout.tokens}, head_dim] (tile-major tokens of "
                         f"{layout}), got shape {tuple(x.shape)}")
    return x.take(inverse_tile_major_permutation(geometry, tile), axis=axis)
