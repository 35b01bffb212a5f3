"""Domain values shared by every layer: frozen, typed, free of I/O."""
