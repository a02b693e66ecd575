"""warmfleet.gateway.openai: the gateway's public API surface.

The OpenAI-compatible routes and native invocations (``handlers``), ``GET /v1/models``
(``models``) and request-body parsing and its limits (``body``); core errors become HTTP
statuses and the OpenAI error envelope in ``warmfleet.gateway.errors``. It may import the gateway's
HTTP stack, state and proxy, and the pure core.
"""
