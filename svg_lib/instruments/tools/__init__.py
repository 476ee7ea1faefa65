"""Layer 8, measuring: the benchmark (`bench`), the block-size tuner (`tuner`, its results in `tune_result`)
and the frontier (`frontier`: recall against predicted time for each mask family, per chip)."""
