"""warmfleet.routing.strategies: every routing strategy, and the only place strategy logic lives.

Each implements ``warmfleet.routing.base.Strategy``; ``warmfleet.routing.factory`` builds them.
"""
