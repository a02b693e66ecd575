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

Immutable values (slots dataclasses with their own ``__init__``, as ``core.types``' value types:
compiled, one is built in tens of ns; a named tuple's ``__new__`` stays an interpreted call, and
a dataclass's generated frozen ``__init__`` costs more still); they hold references into the
parsed body (never copies), are built on the thread that keys them and dropped with the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# ``prompt_options`` of a body that sets none of those fields (read-only: shared).
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True, init=False)
class ChatRequest:
    """A chat-completions body. ``messages`` are objects whose ``role`` is a string and whose
    ``name``, ``tool_call_id``, ``content`` (a string, content parts or null) and
    ``tool_calls`` have the OpenAI shapes; ``tools`` is an array or ``None``."""

    model: str
    tenant: str | None
    cache_salt: str | None
    output_tokens_hint: int
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None
    prompt_options: Mapping[str, Any]
    session: str | None

    def __init__(  # noqa: PLR0917 (the fields in order, as a dataclass takes them)
        self,
        model: str,
        tenant: str | None,
        cache_salt: str | None,
        output_tokens_hint: int,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        prompt_options: Mapping[str, Any] = NO_OPTIONS,
        session: str | None = None,
    ) -> None:
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "cache_salt", cache_salt)
        object.__setattr__(self, "output_tokens_hint", output_tokens_hint)
        object.__setattr__(self, "messages", messages)
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "prompt_options", prompt_options)
        object.__setattr__(self, "session", session)


@dataclass(frozen=True, slots=True, init=False)
class CompletionsRequest:
    """A completions body: one prompt, or a batch (``prompts`` in order, all strings or all
    token-id arrays). ``output_tokens_hint`` covers the whole batch."""

    model: str
    tenant: str | None
    cache_salt: str | None
    output_tokens_hint: int
    prompts: Sequence[str] | Sequence[Sequence[int]]
    prompt_options: Mapping[str, Any]
    session: str | None

    def __init__(  # noqa: PLR0917
        self,
        model: str,
        tenant: str | None,
        cache_salt: str | None,
        output_tokens_hint: int,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        prompt_options: Mapping[str, Any] = NO_OPTIONS,
        session: str | None = None,
    ) -> None:
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "cache_salt", cache_salt)
        object.__setattr__(self, "output_tokens_hint", output_tokens_hint)
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "prompt_options", prompt_options)
        object.__setattr__(self, "session", session)


@dataclass(frozen=True, slots=True, init=False)
class NativeRequest:
    """A native invocation: the raw body (never parsed), keyed under the variant's model."""

    raw: bytes
    model: str
    tenant: str | None
    session: str | None

    def __init__(
        self, raw: bytes, model: str, tenant: str | None, session: str | None = None
    ) -> None:
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "session", session)


KeyRequest = ChatRequest | CompletionsRequest | NativeRequest
