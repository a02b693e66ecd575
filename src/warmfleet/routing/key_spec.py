"""The settings of routing keys (``KeySpec``): the key mode, block size, prefix length and
bounds, salt, tenant and session headers. The hashing they drive is ``routing.keys``; the model
is apart from it because ``routing.keys`` is compiled (docs/compiled.md) and a pydantic model
cannot be."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, JsonValue, field_validator

from warmfleet.core.config import StrictModel
from warmfleet.routing.chat_options import RESERVED_TEMPLATE_KWARGS
from warmfleet.routing.parse import DEFAULT_TENANT_HEADER
from warmfleet.routing.sessions import DEFAULT_SESSION_HEADERS

KeyMode = Literal["text", "bytes", "tokens"]
DEFAULT_BLOCK_SIZE: dict[str, int] = {"text": 128, "bytes": 128, "tokens": 16}
DEFAULT_PREFIX_LENGTH = 4096
DEFAULT_MAX_BLOCKS = 2048  # block hashes a key carries at most
CHARS_PER_TOKEN: Final = 4  # ``text``/``bytes`` keys' estimate of a token's size


def _check_header_name(name: str) -> None:
    if not name or not name.isascii() or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"{name!r} is not a header name (letters, digits, '-', '_')")


class KeySpec(StrictModel):
    """How routing keys are built.

    ``prefix_length`` (units) bounds ``RoutingKey.prefix_hash``; ``None`` means "the strategy's
    prefix_length, else 4096". ``max_units`` caps how much of a prompt is hashed into blocks,
    and ``max_blocks`` how many block hashes a key carries: a strategy's ``choose`` and
    ``on_routed`` cost 0.5-2.5 µs per block on the gateway's event loop (more while its body
    worker competes for the GIL); 2,048 blocks are 262k characters in ``text`` mode, 32k
    tokens in ``tokens`` mode (16-token blocks). Longer prompts are routed on that prefix.
    ``default_chat_template_kwargs`` (``tokens`` mode): the engines' own
    ``--default-chat-template-kwargs``, under each request's ``chat_template_kwargs``.
    ``exclude_tools_when_tool_choice_none`` (``tokens`` mode): the engines run with vLLM's flag
    of that name, so a request with ``tool_choice: "none"`` renders without its tools.
    ``session_headers``: the request headers that name its session, first present wins
    (``routing.sessions``; empty: only the body's ``prompt_cache_key`` does).
    """

    mode: KeyMode = "text"
    block_size: int | None = Field(default=None, gt=0)
    prefix_length: int | None = Field(default=None, gt=0)
    max_units: int = Field(default=1 << 22, gt=0)
    max_blocks: int = Field(default=DEFAULT_MAX_BLOCKS, gt=0)
    salt: str = "warmfleet"
    tenant_header: str = DEFAULT_TENANT_HEADER
    default_chat_template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    exclude_tools_when_tool_choice_none: bool = False
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS

    @field_validator("session_headers")
    @classmethod
    def _header_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _check_header_name(name)
        return tuple(name.lower() for name in value)

    @field_validator("tenant_header")
    @classmethod
    def _tenant_header_name(cls, value: str) -> str:
        _check_header_name(value)  # "" or "x\r\ny" would never match: tenants silently off
        return value

    @field_validator("default_chat_template_kwargs")
    @classmethod
    def _no_renderer_arguments(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        taken = sorted(RESERVED_TEMPLATE_KWARGS & value.keys())
        if taken:
            raise ValueError(f"{taken[0]!r} cannot be set here (the renderer sets it)")
        return value

    @property
    def effective_block_size(self) -> int:
        return self.block_size if self.block_size is not None else DEFAULT_BLOCK_SIZE[self.mode]

    def capacity_blocks(self, kv_capacity_tokens: int) -> int:
        """An engine's KV capacity in key blocks (``text``/``bytes`` blocks hold
        ``block_size / CHARS_PER_TOKEN`` tokens); 0 for an unknown (0) capacity."""
        size = self.effective_block_size
        return kv_capacity_tokens * (1 if self.mode == "tokens" else CHARS_PER_TOKEN) // size
