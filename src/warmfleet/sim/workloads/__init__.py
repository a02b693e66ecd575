"""warmfleet.sim.workloads: synthetic workloads and real-trace replays (pure), shared by the
simulator and the live load generator; trace files are read at the edges.
"""
