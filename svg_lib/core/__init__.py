"""Layer 1, NumPy only: video geometry, attention masks, and the tile planner that turns a mask
into the small tables every kernel reads (`geometry` -> `masks` -> `planner`)."""
