"""Video token geometry and the temporal-major permutation.

Token layout used throughout the series (frame-major): the F*S video tokens come
first, token (frame f, spatial slot s) at index f*S + s, followed by the P text
tokens (if any) at indices F*S .. F*S+P-1. Putting text last keeps the video
indices, the band and the first-frame sink in the same coordinates as the
brief's formulas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VideoGeometry:
    """F latent frames of height x width tokens, plus `text_tokens` text tokens.

    >>> g = VideoGeometry(21, 45, 80)
    >>> g.frame_tokens, g.video_tokens, g.tokens
    (3600, 75600, 75600)
    """

    frames: int
    height: int
    width: int
    text_tokens: int = 0

    def __post_init__(self):
        for name in ("frames", "height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"VideoGeometry.{name} must be a positive integer, got {value!r}")
        if isinstance(self.text_tokens, bool) or not isinstance(self.text_tokens, (int, np.integer)) \
                or self.text_tokens < 0:
            raise ValueError(f"VideoGeometry.text_tokens must be a non-negative integer, got {self.text_tokens!r}")

    @property
    def frame_tokens(self) -> int:
        """S: tokens per latent frame (height * width)."""
        return self.height * self.width

    @property
    def video_tokens(self) -> int:
        """F * S: all video tokens."""
        return self.frames * self.frame_tokens

    @property
    def tokens(self) -> int:
        """N = P + F * S: the sequence length attention sees."""
        return self.video_tokens + self.text_tokens

    def __str__(self) -> str:
        video = f"{self.frames} frames x {self.height}x{self.width}"
        if self.text_tokens:
            return f"{video} = {self.video_tokens:,} video + {self.text_tokens} text = {self.tokens:,} tokens"
        return f"{video} = {self.tokens:,} tokens"


def temporal_major_permutation(geometry: VideoGeometry) -> np.ndarray:
    """Gather indices `perm` [tokens] with `x_temporal = x[perm]`.

    New position j < F*S holds the old frame-major token (j mod F)*S + j // F, so
    the F copies of one spatial slot become neighbours. Text tokens stay put.
    """
    F, S, V = geometry.frames, geometry.frame_tokens, geometry.video_tokens
    j = np.arange(V, dtype=np.int64)
    video = (j % F) * S + j // F
    return np.concatenate([video, np.arange(V, geometry.tokens, dtype=np.int64)])


def inverse_temporal_major_permutation(geometry: VideoGeometry) -> np.ndarray:
    """Gather indices `inv` [tokens] with `x_frame_major = x_temporal[inv]`.

    Old frame-major token i < F*S sits at temporal-major position (i mod S)*F + i // S.
    """
    F, S, V = geometry.frames, geometry.frame_tokens, geometry.video_tokens
    i = np.arange(V, dtype=np.int64)
    video = (i % S) * F + i // S
    return np.concatenate([video, np.arange(V, geometry.tokens, dtype=np.int64)])


def _check_tokens(x, geometry: VideoGeometry, axis: int):
    if x.ndim < 2:
        raise ValueError(f"expected an array shaped [heads, tokens, head_dim], got shape {tuple(x.shape)}")
    if x.shape[axis] != geometry.tokens:
        raise ValueError(
            f"array has {x.shape[axis]} tokens on axis {axis} (shape {tuple(x.shape)}) but the "
            f"geometry {geometry} has {geometry.tokens}")


def to_temporal_major(x, geometry: VideoGeometry, axis: int = -2):
    """Permute `[heads, tokens, head_dim]` (numpy or jax) from frame-major to temporal-major order.

    The same order as `x.take(temporal_major_permutation(geometry), axis)`, computed as a
    reshape and a transpose: the video tokens `[F * S]` seen as `[F, S]` become `[S, F]`. A
    gather reads its indices and moves rows one by one; the transpose is a plain strided copy
    that XLA can fuse with what is around it.
    """
    _check_tokens(x, geometry, axis)
    return _swap_frames(x, geometry, axis, (geometry.frames, geometry.frame_tokens))


def to_frame_major(x, geometry: VideoGeometry, axis: int = -2):
    """Undo `to_temporal_major`: `[heads, tokens, head_dim]` back to frame-major order (`[S, F]` -> `[F, S]`)."""
    _check_tokens(x, geometry, axis)
    return _swap_frames(x, geometry, axis, (geometry.frame_tokens, geometry.frames))


def _swap_frames(x, geometry: VideoGeometry, axis: int, split: tuple[int, int]):
    """The video tokens on `axis` seen as `split` = (a, b), transposed to (b, a); text tokens stay last."""
    axis = axis % x.ndim
    V = geometry.video_tokens
    before, after = tuple(x.shape[:axis]), tuple(x.shape[axis + 1:])
    video = x[(slice(None),) * axis + (slice(0, V),)]
    video = video.reshape(before + split + after).swapaxes(axis, axis + 1).reshape(before + (V,) + after)
    if not geometry.text_tokens:
        return video
    text = x[(slice(None),) * axis + (slice(V, None),)]
    if isinstance(x, np.ndarray):
        return np.concatenate([video, text], axis=axis)
    import jax.numpy as jnp  # a jax array or tracer: jax's own concatenate

    return jnp.concatenate([video, text], axis=axis)

