"""Layer 8, measuring: the benchmark (`bench`) and the block-size tuner (`tuner`, its results in `tune_result`)."""
