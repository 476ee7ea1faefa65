"""Layer 9, for readers: tile-map plots (`plots`), charts of stage costs and speedups (`charts`),
the mask explorer (`explorer`), traversal animations (`traversal`), kernel inspection
(`inspection`), the exercises' checkers (`exercises`)."""
