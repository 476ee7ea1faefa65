"""Layer 6, built on `attention()`: Sparse VideoGen's head routing (`routing`, `profiling`),
multi-chip placement (`multichip`), synthetic video inputs (`synthetic`)."""
