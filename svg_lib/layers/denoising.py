"""A denoising proxy: the clip's heads along a sampler's noise schedule.

A diffusion model does not attend over a clean picture: at step i of its sampler the tokens carry
the noisy latent x_t = alpha_t x_0 + sigma_t eps. Plans (semantic tiles' clusters and tiles) made at
one step and reused at later ones see q and k that moved in between. This proxy moves them the way
the latent moves, without a model.

The schedule is the rectified-flow (flow matching) path Wan 2.1 is trained and sampled on:
alpha_t = 1 - t, sigma_t = t (Liu, Gong and Liu, "Flow Straight and Fast", arXiv 2209.03003;
Lipman et al., "Flow Matching for Generative Modeling", arXiv 2210.02747), sampled at
t_i = shift s_i / (1 + (shift - 1) s_i) for s_i = 1 - i / steps, i = 0 .. steps - 1 (the timestep
shift of Esser et al., "Scaling Rectified Flow Transformers", arXiv 2403.03206, section 5.3.2; Wan
2.1's text-to-video runs shift by 5.0). `flow_sigmas` gives the t_i: step 0 is pure noise (t = 1),
then less noise at every step; at 40 steps and shift 5, t = 0.94 at step 10, 0.83 at 20, 0.63 at
30, 0.11 at 39, so the picture emerges in the last ten steps. On a straight rectified-flow path
one noise draw eps serves every step: x_t runs from eps to x_0.

x_0 is the clip's patch features (`clip_heads.patch_features` at 7,680 tokens,
`clip_heads.load_case_patches` at the case study's 75,600), standardised per feature; eps is
standard Gaussian of the same shape, fixed by the seed. The heads read x_t divided by
sqrt(alpha_t^2 + sigma_t^2), its standard deviation (a model's input scaling: EDM's c_in, Karras et
al. arXiv 2206.00364), by `clip_heads`' recipes with the head's random weights fixed across steps:

* "content" and "mixed": the random Fourier code of x_t (and the grid position, for "mixed"), the
  kernel width from x_t's median distance at that step (`clip_heads.content_points`);
* "spatial", "temporal", "local3d": `structured_qkv`'s code of the grid position, the same at every step;
* every head: q = amp * code + noise * x_t P_q, k = amp * code + noise * x_t P_k, with P_q, P_k
  fixed Gaussian projections `[features, head_dim]` / sqrt(features): the per-token part that
  `clip_qkv` draws as independent noise is here the latent seen through the head's weights, so the
  position heads move with the latent too (a zero-mean move: their token-mean barely changes).

At t = 0 the content heads are `clip_qkv`'s recipe on the clean features (only the per-token part differs).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.layers.clip_heads import (CONTENT_KINDS, check_head_options, content_points, standardise)
from svg_lib.layers.synthetic import KINDS as POSITION_KINDS
from svg_lib.layers.synthetic import structured_qkv

DEFAULT_STEPS = 40    # the case study's end-to-end runs: 40 steps
DEFAULT_SHIFT = 5.0   # Wan 2.1's sample shift for text-to-video


def flow_sigmas(steps: int = DEFAULT_STEPS, shift: float = DEFAULT_SHIFT) -> np.ndarray:
    """float64 `[steps]`: the noise level t_i (= sigma, alpha = 1 - t) of each sampler step, from 1
    (pure noise) down: t_i = shift s_i / (1 + (shift - 1) s_i), s_i = 1 - i / steps."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer (sampler steps), got {steps!r}")
    if isinstance(shift, bool) or not isinstance(shift, (int, float, np.floating)) or not shift > 0:
        raise ValueError(f"shift must be a number > 0 (1: no shift; Wan 2.1 uses 5.0), got {shift!r}")
    s = np.linspace(1.0, 0.0, int(steps) + 1)[:-1]
    return shift * s / (1.0 + (shift - 1.0) * s)


def noisy_latent(x0: np.ndarray, eps: np.ndarray, sigma: float) -> np.ndarray:
    """(alpha x0 + sigma eps) / sqrt(alpha^2 + sigma^2), alpha = 1 - sigma: the rectified-flow latent
    at noise level `sigma` in [0, 1], scaled to unit variance per feature."""
    alpha = 1.0 - sigma
    return (alpha * x0 + sigma * eps) / math.sqrt(alpha ** 2 + sigma ** 2)


class DenoisingStep(NamedTuple):
    """One sampler step of the proxy: its index, noise level, and the heads' q and k
    (float32 `[heads, tokens, head_dim]`, frame-major)."""

    step: int
    sigma: float
    q: object
    k: object


class DenoisingProxy:
    """The heads of `heads_kinds` at every step of a `steps`-step rectified-flow sampler (module docstring).

    features float `[tokens, dims]`, the clean latent x_0 (standardised here per feature);
    geometry: its `VideoGeometry` (no text tokens). Options as in `clip_heads.clip_qkv`.
    `qk(step)` gives one step's (q, k); iterating gives a `DenoisingStep` per step. Deterministic for a seed.
    """

    def __init__(self, features, geometry: VideoGeometry, heads_kinds, *, steps: int = DEFAULT_STEPS,
                 shift: float = DEFAULT_SHIFT, head_dim: int = 64, content_length: float = 0.15,
                 sharpness: float = 10.0, noise: float = 0.3, seed: int = 0):
        self.kinds = check_head_options(heads_kinds, head_dim, content_length, sharpness, noise)
        features = np.asarray(features, np.float64)
        if not isinstance(geometry, VideoGeometry) or geometry.text_tokens or features.ndim != 2 \
                or features.shape[0] != geometry.tokens:
            raise ValueError(f"features must be [tokens, dims] for the video tokens of geometry (no text tokens); "
                             f"got features {features.shape} and geometry {geometry!r}")
        self.sigmas = flow_sigmas(steps, shift)
        self.geometry, self.head_dim = geometry, int(head_dim)
        self.content_length, self.sharpness, self.noise, self.seed = content_length, sharpness, noise, seed
        self.x0 = standardise(features)
        rng = np.random.default_rng([seed, 2])
        self.eps = rng.standard_normal(self.x0.shape)
        dims = self.x0.shape[1]
        m = self.head_dim // 2
        heads = len(self.kinds)
        self.amp = math.sqrt(sharpness * math.sqrt(head_dim))
        # the head's weights: fixed across steps
        self.project = rng.standard_normal((heads, 2, dims, self.head_dim)) / math.sqrt(dims)
        self.frequencies = {}
        for i, kind in enumerate(self.kinds):
            if kind in CONTENT_KINDS:
                extra = 3 if kind == "mixed" else 0
                self.frequencies[i] = rng.standard_normal((m, dims + extra))
        positional = [i for i, kind in enumerate(self.kinds) if kind in POSITION_KINDS]
        self.position_code = {}
        if positional:
            code, _, _ = structured_qkv(geometry, [self.kinds[i] for i in positional], self.head_dim,
                                        sharpness=sharpness, noise=0.0, seed=seed)
            for j, i in enumerate(positional):
                self.position_code[i] = np.asarray(code[j], np.float64)   # amp * code already

    @property
    def steps(self) -> int:
        return len(self.sigmas)

    def qk(self, step: int):
        """(q, k) float32 `[heads, tokens, head_dim]` at sampler step `step` (0: pure noise)."""
        import jax.numpy as jnp

        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < self.steps:
            raise ValueError(f"step must be an integer in [0, {self.steps}), got {step!r}")
        x = noisy_latent(self.x0, self.eps, float(self.sigmas[step]))
        tokens, heads = self.geometry.tokens, len(self.kinds)
        q = np.empty((heads, tokens, self.head_dim), np.float32)
        k = np.empty_like(q)
        for i, kind in enumerate(self.kinds):
            if kind in CONTENT_KINDS:
                points = content_points(x, self.geometry, kind, content_length=self.content_length,
                                        sharpness=self.sharpness, seed=self.seed)
                angle = points @ self.frequencies[i].T
                m = angle.shape[1]
                code = self.amp * np.concatenate([np.cos(angle), np.sin(angle)], axis=1) / math.sqrt(m)
            else:
                code = self.position_code[i]
            q[i] = code + self.noise * (x @ self.project[i, 0])
            k[i] = code + self.noise * (x @ self.project[i, 1])
        return jnp.asarray(q), jnp.asarray(k)

    def __iter__(self):
        for step in range(self.steps):
            yield DenoisingStep(step, float(self.sigmas[step]), *self.qk(step))
