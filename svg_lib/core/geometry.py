"""Video token geometry and the temporal-major permutation.

Token layout used throughout the series (frame-major): the F*S video tokens come
first, token (frame f, spatial slot s) at index f*S + s, followed by the P text
tokens (if any) at indices F*S .. F*S+P-1. Putting text last keeps the video
indices, the band and the first-frame sink in the same coordinates as the
brief's formulas. Moving `[heads, tokens, head_dim]` arrays into temporal-major order and back (the
routed layer's) is `svg_lib.extensions.token_order`.
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
