"""warmfleet.local: the laptop fleet behind ``warmfleet up fleet.yaml`` (a composition root).

Runs a whole fleet on this machine: an origin, node agents, emulated engines and a gateway as
local processes, reconciled by the pure ``warmfleet.control`` planner. It is built on the shells'
public entry points and may import any package except ``warmfleet.cli``; nothing imports it but
the root CLI. Its origin (``origin.py``) is product code; the harnesses that drive the fleet
(the acceptance run, fault injection) live under ``tests/harness``, not here.
"""
