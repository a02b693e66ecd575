"""warmfleet.sim: the one virtual-time fleet simulator and its workloads, pure.

``simulator`` (the kernel, ``Simulator``) runs the real routing strategies
(``warmfleet.routing.factory``) over simulated instances in virtual time: engine models
(``warmfleet.engine``) or calibrated ``servers.SlotServer`` replicas, with scale events and an
optional fleet controller (``fleet``: instances that join at a ready time). ``scenario`` and
``runner`` are its documents and strategy comparisons; ``whatif`` and ``scaleout`` the scale-out
what-if on the same kernel; ``workloads`` generates and replays traffic. It may import the pure
packages below it (``control``, ``api``, ``routing``, ``engine``, ``cache``, ``core``), never a
shell nor ``warmfleet.edge``: callers read the files and pass their contents in.
"""
