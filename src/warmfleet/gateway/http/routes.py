"""Request dispatch: method + path -> handler, with ``{name}`` path parameters (one segment) and
``{name:path}`` (the rest of the path, slashes included: model ids such as ``org/model``).

Static paths are one dict lookup (the OpenAI routes are static); patterns are tried in the order
they were added. A known path with another method gets 405 (with an ``Allow`` header), an
unknown path 404, both as the OpenAI error envelope. HEAD is answered by the GET handler (the
HTTP layer sends no body).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from warmfleet.gateway.http.messages import ErrorFactory, Handler, Request, Response

_PARAM = re.compile(r"\{(\w+)(:path)?\}")


def _group(param: re.Match[str]) -> str:
    return f"(?P<{param.group(1)}>{'.+' if param.group(2) else '[^/]+'})"


class Routes:
    def __init__(self, error: ErrorFactory) -> None:
        self._static: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        self._error = error

    def add(self, method: str, path: str, handler: Handler) -> None:
        if "{" not in path:
            self._static.setdefault(path, {})[method] = handler
            return
        regex = re.compile("^" + _PARAM.sub(_group, path) + "$")
        for known, methods in self._patterns:
            if known.pattern == regex.pattern:
                methods[method] = handler
                return
        self._patterns.append((regex, {method: handler}))

    async def dispatch(self, request: Request) -> Response | None:
        methods = self._static.get(request.path)
        if methods is None:
            for regex, candidates in self._patterns:
                match = regex.match(request.path)
                if match is not None:
                    request.match_info = {k: unquote(v) for k, v in match.groupdict().items()}
                    methods = candidates
                    break
        if methods is None:
            return self._error(404, f"no route for {request.method} {request.path}")
        handler = methods.get(request.method)
        if handler is None and request.method == "HEAD":
            handler = methods.get("GET")
        if handler is None:
            answer = self._error(405, f"method {request.method} not allowed on {request.path}")
            allowed = sorted({*methods, "HEAD"} if "GET" in methods else methods)
            answer.headers = {**(answer.headers or {}), "Allow": ", ".join(allowed)}
            return answer
        return await handler(request)
