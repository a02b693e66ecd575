"""warmfleet.operator."""
