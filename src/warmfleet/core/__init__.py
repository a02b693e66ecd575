"""Types, errors and helpers shared by every layer. Pure: no I/O."""
