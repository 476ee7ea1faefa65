"""Layer 9, for readers: tile-map plots (`plots`), charts of stage costs and speedups (`charts`),
the mask explorer (`explorer`), traversal animations (`traversal`), kernel inspection
(`inspection`), notebook 10's sliding-tile search (`sliding_search`), notebook 12's recorded plan
costs (`semantic_cost`), the exercises' checkers (`exercises`)."""
