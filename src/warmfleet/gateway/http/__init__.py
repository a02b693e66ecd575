"""warmfleet.gateway.http: the gateway's own HTTP/1.1 stack on asyncio + httptools (llhttp).

The server side (``listener``: sockets and timeouts; ``wire``: one client connection; ``answers``:
writing responses and streams; ``messages``: requests and responses; ``routes``: method + path
dispatch; ``access_log``) and the client side (``upstream``: pooled connections to instances,
``upstream_pool``). It knows nothing about routing or OpenAI: it may import ``warmfleet.core`` and
its own modules only. ``docs/gateway.md`` says why the gateway does not use an HTTP framework.
"""
