"""warmfleet.engine."""
