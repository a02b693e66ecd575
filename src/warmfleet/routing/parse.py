"""Parsing what a router keys, once: a chat, completions, Responses or embeddings body, or a
native invocation, into a ``routing.request`` object (``parse_chat``, ``parse_completions``,
``parse_responses``: the chat it renders, ``routing.responses_input``; ``parse_embeddings``: its
inputs as a completions batch; ``parse_native``).

The checks are structural (types and shapes, in a fixed order: the body, the tenant, ``model``,
``cache_salt``, the output-token fields, then the prompt), so a body with several faults always
names the same one; nothing is rendered here (``routing.canonical`` renders a chat's text for the
key modes that hash it). Every malformed input becomes ``BadRequestError(param=...)``; nothing
else escapes. The fields only the ``tokens`` key mode reads (``request.prompt_options``) are
validated there (``routing.chat_options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet.core.errors import BadRequestError
from warmfleet.routing.request import (
    NO_OPTIONS,
    ChatRequest,
    CompletionsRequest,
    NativeRequest,
)
from warmfleet.routing.responses_input import responses_messages

MAX_TENANT_CHARS = 64
DEFAULT_TENANT_HEADER = "x-prefix-aware-id"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# The largest token count or ``n`` accepted (a signed 64-bit integer, as the engines hold them):
# a larger one (a JSON integer of hundreds of digits) overflows the strategies' float arithmetic.
MAX_COUNT = (1 << 63) - 1
# The output hint's cap (longer than any context): ``n`` x ``max_tokens`` of any accepted size
# (up to 2**126) stays a 64-bit count, with the prompt's tokens, on the replica-sync wire.
MAX_OUTPUT_HINT = 1 << 32
_MASK64 = (1 << 64) - 1
# Content-part types vLLM reads as plain text (``vllm.renderers.chat_utils.TEXT_PART_TYPES``).
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# The chat fields, besides ``messages`` and ``tools``, that change vLLM's rendered prompt
# (``routing.chat_options``), and the completions one that changes its token ids.
CHAT_TEMPLATE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "reasoning_effort",
    "chat_template",
    "chat_template_kwargs",
)
_CHAT_OPTIONS = frozenset({*CHAT_TEMPLATE_FIELDS, "tool_choice"})
_COMPLETIONS_OPTIONS = frozenset({"add_special_tokens"})


def bad_request(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


# --------------------------------------------------------------------------------------------
# The request kinds


def parse_chat(
    body: object,
    tenant: str | None = None,
    tenant_header: str = DEFAULT_TENANT_HEADER,
    session: str | None = None,
) -> ChatRequest:
    """A chat-completions body. ``tenant``: the value of the tenant header (named
    ``tenant_header`` in errors), overridden by the body's ``prompt_cache_key``. ``session``:
    the request's session header (``routing.sessions``), else the body's ``prompt_cache_key``
    is the session."""
    fields = _object(body)
    tenant_key, model, salt, session = _chain_fields(fields, tenant, tenant_header, session)
    hint = output_hint(fields)
    messages = validate_messages(fields)
    tools = fields.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    for i, message in enumerate(messages):
        # The common message, a role and a string content, has nothing more to check.
        if len(message) != 2 or type(message.get("content")) is not str:
            _check_message(message, i)
    options = NO_OPTIONS if _CHAT_OPTIONS.isdisjoint(fields) else _options(fields, _CHAT_OPTIONS)
    return ChatRequest(model, tenant_key, salt, hint, messages, tools, options, session)


def parse_completions(
    body: object,
    tenant: str | None = None,
    tenant_header: str = DEFAULT_TENANT_HEADER,
    session: str | None = None,
) -> CompletionsRequest:
    """A completions body (one prompt or a batch); ``tenant`` as for ``parse_chat``."""
    fields = _object(body)
    tenant_key, model, salt, session = _chain_fields(fields, tenant, tenant_header, session)
    prompts = completions_prompts(fields.get("prompt"))
    hint = completions_output_hint(fields, len(prompts))
    options = _options(fields, _COMPLETIONS_OPTIONS)
    return CompletionsRequest(model, tenant_key, salt, hint, prompts, options, session)


def parse_responses(
    body: object,
    tenant: str | None = None,
    tenant_header: str = DEFAULT_TENANT_HEADER,
    session: str | None = None,
) -> ChatRequest:
    """A Responses body: the chat of its ``instructions`` and ``input``
    (``routing.responses_input``), its ``tools`` as they are, ``max_output_tokens`` the output
    hint; ``tenant`` as for ``parse_chat`` (the Responses API has ``prompt_cache_key`` too)."""
    fields = _object(body)
    tenant_key, model, salt, session = _chain_fields(fields, tenant, tenant_header, session)
    hint = min(_max_tokens(fields, "max_output_tokens") or 0, MAX_OUTPUT_HINT)
    messages = responses_messages(fields)
    tools = fields.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    return ChatRequest(model, tenant_key, salt, hint, messages, tools, session=session)


def parse_embeddings(
    body: object,
    tenant: str | None = None,
    tenant_header: str = DEFAULT_TENANT_HEADER,
    session: str | None = None,
) -> CompletionsRequest:
    """An embeddings body: its ``input`` (a string, token ids, or a batch of either) keyed as
    a completions batch with no output; ``tenant`` as for ``parse_chat``."""
    fields = _object(body)
    tenant_key, model, salt, session = _chain_fields(fields, tenant, tenant_header, session)
    prompts = completions_prompts(fields.get("input"), "input")
    options = _options(fields, _COMPLETIONS_OPTIONS)
    return CompletionsRequest(model, tenant_key, salt, 0, prompts, options, session)


def parse_native(
    raw: bytes,
    tenant: str | None,
    model: str,
    tenant_header: str = DEFAULT_TENANT_HEADER,
    session: str | None = None,
) -> NativeRequest:
    """A native invocation's raw body, keyed under ``model`` (the variant's); ``session``: its
    session header's value."""
    return NativeRequest(raw, model, _tenant(None, tenant, tenant_header), session)


def _object(body: object) -> Mapping[str, Any]:
    # ``type() is dict`` first: the ABC check alone costs more than the rest of a small parse.
    if type(body) is not dict and not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object", "body")
    return body


def _options(body: Mapping[str, Any], names: frozenset[str]) -> Mapping[str, Any]:
    """The body's fields among ``names`` (most bodies set none: one C-level scan of its keys)."""
    if names.isdisjoint(body):
        return NO_OPTIONS
    return {name: body[name] for name in body if name in names}


# --------------------------------------------------------------------------------------------
# Fields every kind reads


def validate_tenant(value: object, param: str) -> str:
    """A tenant key: 1-64 printable ASCII characters."""
    if not isinstance(value, str):
        raise bad_request(f"'{param}' must be a string", param)
    if not 0 < len(value) <= MAX_TENANT_CHARS:
        raise bad_request(f"'{param}' must be 1 to {MAX_TENANT_CHARS} characters", param)
    if not (value.isascii() and value.isprintable()):
        raise bad_request(f"'{param}' must be printable ASCII", param)
    return value


def _tenant(body: Mapping[str, Any] | None, header: str | None, header_name: str) -> str | None:
    if body is not None and body.get("prompt_cache_key") is not None:
        return validate_tenant(body["prompt_cache_key"], "prompt_cache_key")
    if header is not None:
        return validate_tenant(header, header_name)
    return None


def _chain_fields(
    body: Mapping[str, Any], header: str | None, header_name: str, session: str | None
) -> tuple[str | None, str, str | None, str | None]:
    """What the chain seed is made of, checked in this order: the tenant, ``model`` and
    ``cache_salt`` (the usual values without a call each: this runs for every request); and
    the session (``session``, else the body's ``prompt_cache_key``)."""
    tenant = None
    if header is not None or "prompt_cache_key" in body:
        tenant = _tenant(body, header, header_name)
        if session is None and body.get("prompt_cache_key") is not None:
            session = tenant
    model = body.get("model")
    if type(model) is not str or not model:
        model = model_of(body)
    salt = body.get("cache_salt")
    if salt is not None:
        salt = cache_salt_of(body)
    return tenant, model, salt, session


def cache_salt_of(body: Mapping[str, Any]) -> str | None:
    """vLLM's ``cache_salt``: its prefix-cache blocks are only shared by requests with the same
    salt, so it is part of the chain seed. vLLM rejects anything but a non-empty string."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise bad_request("'cache_salt' must be a non-empty string", "cache_salt")
    return salt


def model_of(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    return model


def _max_tokens(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise bad_request(f"'{name}' must be a non-negative integer", name)
    return value


def _choices(body: Mapping[str, Any]) -> int:
    """``n``: completions generated per prompt (default 1)."""
    n = body.get("n")
    if n is None:
        return 1
    if type(n) is int and 1 <= n <= MAX_COUNT:
        return n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT:
        raise bad_request("'n' must be a positive integer", "n")
    return n


def output_hint(body: Mapping[str, Any]) -> int:
    """Chat: ``n`` x (``max_completion_tokens``, else ``max_tokens``); 0 (unknown) if neither,
    as vLLM then generates up to the context length; at most ``MAX_OUTPUT_HINT``."""
    name = "max_completion_tokens"
    limit = body.get(name)
    if limit is None:
        name = "max_tokens"
        limit = body.get(name)
    if limit is not None and (type(limit) is not int or not 0 <= limit <= MAX_COUNT):
        limit = _max_tokens(body, name)  # raises, unless an int subclass
    return min((limit or 0) * _choices(body), MAX_OUTPUT_HINT)


def completions_output_hint(body: Mapping[str, Any], prompts: int) -> int:
    """Completions: ``prompts`` x ``n`` x ``max_tokens`` (absent or null: 16, as in the OpenAI
    API and vLLM; ``max_completion_tokens`` is not a completions parameter and is ignored); at
    most ``MAX_OUTPUT_HINT``."""
    limit = _max_tokens(body, "max_tokens")
    if limit is None:
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    return min(limit * _choices(body) * prompts, MAX_OUTPUT_HINT)


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean request field as vLLM's pydantic models read one declared ``bool`` with a
    default: absent gives the default; anything else but true/false (``null`` too) is a 400."""
    if name not in body:
        return default
    value = body[name]
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return value


# --------------------------------------------------------------------------------------------
# Chat messages (the shapes ``routing.canonical`` and the tokenizers rely on)


def validate_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        if type(message) is not dict and not isinstance(message, Mapping):
            raise bad_request(f"'messages[{i}]' must be an object", f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"'messages[{i}].role' must be a string", f"messages[{i}].role")
    return messages


def _check_message(message: Mapping[str, Any], index: int) -> None:
    """``name`` and ``tool_call_id`` (strings or null), ``content``, then ``tool_calls``. The
    params of errors are only formatted for an error."""
    for name in ("name", "tool_call_id"):
        value = message.get(name)
        if value is not None and not isinstance(value, str):
            param = f"messages[{index}].{name}"
            raise bad_request(f"'{param}' must be a string", param)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            param = f"messages[{index}].content"
            raise bad_request(
                f"'{param}' must be a string, an array of content parts or null", param
            )
        for j, part in enumerate(content):
            _check_part(part, index, j)
    calls = message.get("tool_calls")
    if calls is not None:
        _check_tool_calls(calls, f"messages[{index}].tool_calls")


def _check_part(part: object, index: int, position: int) -> None:
    if type(part) is not dict and not isinstance(part, Mapping):
        param = f"messages[{index}].content[{position}]"
        raise bad_request(f"'{param}' must be an object", param)
    kind = part.get("type")
    if not isinstance(kind, str):
        param = f"messages[{index}].content[{position}].type"
        raise bad_request(f"'{param}' must be a string", param)
    if kind in TEXT_PARTS:
        field = "text"
        ok = isinstance(part.get("text"), str)
    elif kind == "image_url":
        field = "image_url"
        image = part.get("image_url")
        ok = isinstance(image.get("url") if isinstance(image, Mapping) else image, str)
    elif kind == "refusal":
        field = "refusal"
        ok = isinstance(part.get("refusal"), str)
    else:
        return  # other kinds (input_audio, file, ...) are keyed by their canonical JSON
    if not ok:
        param = f"messages[{index}].content[{position}]"
        name = "image_url.url" if field == "image_url" else field
        raise bad_request(f"'{param}.{name}' must be a string", f"{param}.{field}")


def _check_tool_calls(calls: object, param: str) -> None:
    if not isinstance(calls, list):
        raise bad_request(f"'{param}' must be an array", param)
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        if not isinstance(call, Mapping):
            raise bad_request(f"'{where}' must be an object", where)
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise bad_request(f"'{where}.function' must be an object", f"{where}.function")
        if not isinstance(function.get("name"), str):
            raise bad_request(f"'{where}.function.name' must be a string", f"{where}.function.name")
        if not isinstance(function.get("arguments", ""), str):
            where_args = f"{where}.function.arguments"
            raise bad_request(f"'{where_args}' must be a string", where_args)
        if not isinstance(call.get("id", ""), str):
            raise bad_request(f"'{where}.id' must be a string", f"{where}.id")


# --------------------------------------------------------------------------------------------
# Completions prompts


def _is_token_list(value: object) -> bool:
    """A list of ints in [0, 2**64) (bools excluded); empty lists pass."""
    if not isinstance(value, list):
        return False
    if not all(type(t) is int for t in value):
        return False
    return not value or (min(value) >= 0 and max(value) <= _MASK64)


def completions_prompts(prompt: object, param: str = "prompt") -> list[str] | list[list[int]]:
    """Every prompt of a completions body's ``prompt`` (or an embeddings body's ``input``,
    named ``param``), validated: a string or one array of token ids is one prompt; an array of
    strings or of token-id arrays is a batch (the engine runs each as its own request).
    Token-id arrays are returned as they are (not copied)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            if not all(isinstance(p, str) for p in prompt):
                raise bad_request(f"'{param}' array must hold only strings", param)
            return prompt
        if isinstance(first, list):
            if not all(_is_token_list(p) and p for p in prompt):
                raise bad_request(f"'{param}' must be an array of non-empty token-id arrays", param)
            return prompt
        if _is_token_list(prompt):
            return [prompt]
    raise bad_request(
        f"'{param}' must be a string, an array of strings, token ids or token-id arrays", param
    )
