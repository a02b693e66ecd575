"""Flow control (docs/flow-control.md): queue instead of spill, priority bands, token-weighted
tenant fairness (virtual token counters), deadlines, shedding and a TTFT predictor.

Pure and synchronous over ``FleetSnapshot``s with times passed in: the live gateway and the
virtual-time simulator drive the same ``FlowGate`` objects.
"""
