"""warmfleet.api: the pure contracts every shell speaks.

The resource model (the ``InferenceEndpoint``, ``ModelCache`` and ``ImageCache`` documents and
their CRDs, ``resources`` and ``crds``), the names and labels derived from it (``names``), the one
API version (``resources.API_VERSION``), the wire format of the engines' KV-cache events
(``kv_events``) and that of the notes gateway replicas exchange (``replica_sync``). Pure: it may
import ``warmfleet.core``, ``warmfleet.routing`` (routing settings are part of an endpoint's spec,
the sync notes are routing's) and ``warmfleet.cache`` (model sources), and nothing that does I/O.
The gateway, the emulator, the node agent and the operator import it instead of each other.
"""
