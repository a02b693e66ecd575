"""What a router keys: a request body parsed once (``routing.parse``) into a typed, frozen object.

Three kinds, one per endpoint: ``ChatRequest`` (``/v1/chat/completions``), ``CompletionsRequest``
(``/v1/completions``) and ``NativeRequest`` (native invocations, keyed on the raw body). Each
carries what every key mode reads, already validated: the model, the tenant (the body's
``prompt_cache_key``, else the tenant header), vLLM's ``cache_salt``, the output-token hint, the
prompt (messages and tools, prompts, or raw bytes) and the session id (``routing.sessions``: a
session header's value, else the body's ``prompt_cache_key``; ``None`` without either).
``prompt_options`` holds the body's fields that change how the engine renders or tokenizes the
prompt (``add_generation_prompt``, ``chat_template_kwargs``, ``add_special_tokens``,
``tool_choice``, ...): only the ``tokens`` key mode reads them, so only it validates them
(``routing.chat_options``), and a body that other modes key stays accepted whatever they hold.

Immutable values (named tuples: a frozen dataclass costs four times as much to build, on the
path of every request); they hold references into the parsed body (never copies), are built on
the thread that keys them and dropped with the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

# ``prompt_options`` of a body that sets none of those fields (read-only: shared).
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


class ChatRequest(NamedTuple):
    """A chat-completions body. ``messages`` are objects whose ``role`` is a string and whose
    ``name``, ``tool_call_id``, ``content`` (a string, content parts or null) and
    ``tool_calls`` have the OpenAI shapes; ``tools`` is an array or ``None``."""

    model: str
    tenant: str | None
    cache_salt: str | None
    output_tokens_hint: int
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None
    prompt_options: Mapping[str, Any] = NO_OPTIONS
    session: str | None = None


class CompletionsRequest(NamedTuple):
    """A completions body: one prompt, or a batch (``prompts`` in order, all strings or all
    token-id arrays). ``output_tokens_hint`` covers the whole batch."""

    model: str
    tenant: str | None
    cache_salt: str | None
    output_tokens_hint: int
    prompts: Sequence[str] | Sequence[Sequence[int]]
    prompt_options: Mapping[str, Any] = NO_OPTIONS
    session: str | None = None


class NativeRequest(NamedTuple):
    """A native invocation: the raw body (never parsed), keyed under the variant's model."""

    raw: bytes
    model: str
    tenant: str | None
    session: str | None = None


KeyRequest = ChatRequest | CompletionsRequest | NativeRequest
