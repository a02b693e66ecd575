"""The laptop fleet behind ``warmfleet up fleet.yaml`` and ``warmfleet status``: a composition
root of its own that runs a whole fleet on this machine (a model origin, one node agent per
node, emulated engines, the gateway, the reconciler loop), each part a real child process.

It may import the shells (gateway, emulator, agent), the control plane and the pure core; nothing
imports it but the root CLI. Test harnesses that drive it (the acceptance run, fault injection)
live under ``tests/harness``, not here.
"""
