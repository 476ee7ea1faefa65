"""Layer 4, the Pallas kernels and what they are checked against: `forward` (dense, B1, B2, B3,
one online-softmax tile body), `backward` (fused, or dq and dk/dv), `splash` (JAX's Splash attention,
adapted), `reference` (dense attention in jax and float64 NumPy). The tolerances they are
checked with are in `svg_lib.extensions.tolerances`."""
