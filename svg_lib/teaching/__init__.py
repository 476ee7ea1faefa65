"""Layer 9, for readers: tile-map plots (`plots`), the mask explorer (`explorer`), traversal
animations (`traversal`), kernel inspection (`inspection`), the exercises' checkers (`exercises`)."""
