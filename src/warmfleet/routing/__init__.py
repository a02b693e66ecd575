"""Routing core (pure): routing keys, hash ring, prefix index and strategies."""
