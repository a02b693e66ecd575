"""warmfleet.core: types, errors, configuration helpers, clocks and hashing shared by every
layer. Pure (no I/O, nothing above it): every other package may import it.
"""
