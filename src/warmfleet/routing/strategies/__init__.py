"""Routing strategies; each implements ``warmfleet.routing.base.Strategy``."""
