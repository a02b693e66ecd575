"""warmfleet.bench."""
