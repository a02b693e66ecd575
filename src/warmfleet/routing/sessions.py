"""Sessions: a request's session id (a conversation, an agent program) and the instance each
session was last routed to (docs/routing.md, "Session affinity").

A session id comes from the first of the variant's session headers the request carries
(``routing.key.sessionHeaders``: ``x-warmfleet-session`` and the agents' own headers), else from
the body's ``prompt_cache_key``. It is hashed with the key's chain seed (salt, model, tenant)
into ``RoutingKey.session``; no raw id is kept. ``SessionHomes`` is the bounded map from a
session to its instance that ``prefix_affinity`` learns in ``on_routed`` (from its own
decisions and from its peers' ``RoutedNote``s alike).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import xxhash

from warmfleet.core.types import InstanceId
from warmfleet.routing.parse import bad_request

MAX_SESSION_CHARS = 256
# x-warmfleet-session; Claude Code's; OpenAI Codex CLI's; a common generic one.
DEFAULT_SESSION_HEADERS = (
    "x-warmfleet-session",
    "x-claude-code-session-id",
    "session_id",
    "x-session-id",
)
SESSION_ENTRIES = 1 << 17
_SESSION_SALT = 0x5E55
_h64 = xxhash.xxh3_64_intdigest


def session_from_headers(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The value of the first header of ``names`` (lower-case) that ``headers`` carries and is
    not empty; more than ``MAX_SESSION_CHARS`` characters is a bad request naming the header."""
    for name in names:
        value = headers.get(name)
        if value:
            if len(value) > MAX_SESSION_CHARS:
                raise bad_request(f"'{name}' must be at most {MAX_SESSION_CHARS} characters", name)
            return value
    return None


def session_hash(session: str, seed: int) -> int:
    """``RoutingKey.session`` of a session id under the chain seed ``seed``."""
    return _h64(session.encode("utf-8", "surrogatepass"), seed ^ _SESSION_SALT)


class SessionHomes:
    """Session hash -> the instance it was last routed to: an LRU of ``entries`` sessions (the
    least recently routed is forgotten first)."""

    __slots__ = ("_entries", "_homes")

    def __init__(self, entries: int = SESSION_ENTRIES) -> None:
        if entries < 1:
            raise ValueError("entries must be at least 1")
        self._entries = entries
        self._homes: OrderedDict[int, InstanceId] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def get(self, session: int) -> InstanceId | None:
        return self._homes.get(session)

    def learn(self, session: int, instance_id: InstanceId) -> None:
        homes = self._homes
        homes[session] = instance_id
        homes.move_to_end(session)
        if len(homes) > self._entries:
            homes.popitem(last=False)
