"""Layer 1, NumPy only: video geometry, attention masks (`masks`: the protocol and B3's
tile-aligned rounding; `svg_masks`: Sparse VideoGen's), and the tile planner that turns a mask into
the small tables every kernel reads (`geometry` -> `masks` -> `svg_masks` -> `planner`)."""
