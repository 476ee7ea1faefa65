"""Layer 7, TPU tooling that needs no TPU: lowering to Mosaic (`lowering`), compiling with libtpu
for a compile-only topology (`compiler`), and the compiler's simulated cycle counts (`cost`)."""
