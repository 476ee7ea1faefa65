"""Moving `[heads, tokens, head_dim]` arrays (numpy or jax) between frame-major and temporal-major order.

The routed layer (`svg_lib.layers.routing`) puts a temporal head's q, k and v in temporal-major
order, runs the spatial mask's kernel on them and puts the output back: `to_temporal_major` and
`to_frame_major`, a reshape and a transpose rather than a gather by
`core.geometry.temporal_major_permutation` (the same order). The lesson's `attention(...)` never
moves an array: it takes the tokens in whatever order the caller holds them, and a mask's
positions (`TemporalMask` computes them arithmetically in the kernel). `_check_tokens` is the shape
check these and `tile_layout`'s reorderings share.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry


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

