"""Layer 1, NumPy only: video geometry, attention masks (`masks`; `sliding` for 3-D sliding
tiles), and the tile planner that turns a mask into the small tables every kernel reads
(`geometry` -> `masks` -> `sliding` -> `planner`)."""
