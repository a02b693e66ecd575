"""warmfleet.kube: the one Kubernetes API client (I/O, aiohttp).

Reaching the API server (``access``: URL, rotating bearer tokens, TLS), list-then-watch
(``watch``), a small REST client for the operator (``client``) and EndpointSlice semantics
(``endpointslices``, pure). Shared by the gateway's discovery, the node agent and the operator;
it imports ``warmfleet.core`` only.
"""
