"""Layer 9, for readers: tile-map plots (`plots`), charts of stage costs and speedups (`charts`),
the mask explorer (`explorer`), traversal animations (`traversal`), kernel inspection
(`inspection`), notebook 10's sliding-tile search (`sliding_search`), the exercises' checkers
(`exercises`)."""
