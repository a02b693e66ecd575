"""warmfleet.routing: the routing core, pure.

Request parsing (``parse``: a body, once, into a ``request`` object) and routing keys (one builder
per key mode, ``key_modes``), prefix hashing, the hash ring, the approximate prefix index and the
strategies (``strategies``), built by ``factory`` from typed configuration. The same objects
run in the live gateway and in the simulator; ``replicas`` keeps a gateway replica's strategy
and load view in agreement with its peers' (the notes of ``replica_notes``). It imports
``warmfleet.core`` only.
"""
