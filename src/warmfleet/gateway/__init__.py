"""warmfleet.gateway: the OpenAI-compatible, prefix-aware gateway (an I/O shell).

Sub-packages: ``http`` (its own HTTP/1.1 server and upstream client), ``discovery`` (file and
Kubernetes sources of instances), ``openai`` (the public API surface), ``kv_events`` (engines'
KV-cache events -> the exact prefix index). At the top: configuration (``config``,
``server_config``, ``kv_config``), live state
(``world``: endpoints and how a configuration document is applied to them; ``variant``: a
variant's instances, load and health; ``instance``; ``runtime``: what the app's lifespan owns),
the request path (``proxy``, ``relay``, ``instance``, ``outlier``, ``health``), ``admin``,
``metrics``, ``app`` and ``server``. It routes with ``warmfleet.routing`` and speaks
``warmfleet.api``; it may use ``warmfleet.kube``, never the emulator, the agent, the operator or
``warmfleet.control``.
"""
