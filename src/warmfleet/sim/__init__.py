"""warmfleet.sim: the one virtual-time fleet simulator and its workloads, pure.

``simulator`` runs the real routing strategies (``warmfleet.routing.factory``) over engine models
(``warmfleet.engine``) in virtual time; ``scenario`` and ``runner`` are its documents and runs;
``workloads`` generates and replays traffic. It may import the pure packages below it (``control``,
``api``, ``routing``, ``engine``, ``cache``, ``core``), never a shell.
"""
