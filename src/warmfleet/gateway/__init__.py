"""warmfleet.gateway."""
