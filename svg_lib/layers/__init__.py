"""Layer 6, built on `attention()`: Sparse VideoGen's head routing (`routing`, `profiling`),
multi-chip placement (`multichip`), synthetic and real-clip video inputs (`synthetic`,
`clip_heads`), and masks computed from q and k on the device: semantic tiles (`semantic`,
`semantic_clusters`, `semantic_router`, `semantic_quality`) and pooled estimates (`pooled`)."""
