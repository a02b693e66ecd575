"""What users run to measure a fleet: the load generator (``warmfleet bench``), the live demo
(``warmfleet demo``), the simulator commands, engine conformance, and the benchmarks run by
``make bench-routing`` and ``make bench-peers`` (with their reference proxies).

It may import the shells and the simulator; only the root CLI imports it. Harnesses that need
test doubles (fault injectors, fake registries, acceptance runs) live under ``tests/harness``.
"""
