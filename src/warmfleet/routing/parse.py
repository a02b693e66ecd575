"""Parsing what a router sees: OpenAI chat and completions bodies, tenant keys.

Every malformed input becomes ``BadRequestError(param=...)``; nothing else escapes. The chat body
is rendered canonically (independent of JSON whitespace and key order) for ``text`` keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from warmfleet.core.errors import BadRequestError

MAX_TENANT_CHARS = 64
_MASK64 = (1 << 64) - 1

# Separators of the canonical rendering; control characters that JSON text rarely contains.
_MSG = "\x1e"
_FIELD = "\x1f"
_PART = "\x1d"
# Content-part types vLLM reads as plain text (``vllm.renderers.chat_utils.TEXT_PART_TYPES``).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# Canonical JSON (stateless between calls: safe from several threads); arrays longer than
# _SPLIT_ITEMS are encoded element by element.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_SPLIT_ITEMS = 16


# --------------------------------------------------------------------------------------------
# Validation helpers (every malformed input becomes BadRequestError)


def bad_request(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def validate_tenant(value: object, param: str) -> str:
    """A tenant key: 1-64 printable ASCII characters."""
    if not isinstance(value, str):
        raise bad_request(f"'{param}' must be a string", param)
    if not 0 < len(value) <= MAX_TENANT_CHARS:
        raise bad_request(f"'{param}' must be 1 to {MAX_TENANT_CHARS} characters", param)
    if not (value.isascii() and value.isprintable()):
        raise bad_request(f"'{param}' must be printable ASCII", param)
    return value


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
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"'{name}' must be a non-negative integer", name)
    return value


def _choices(body: Mapping[str, Any]) -> int:
    """``n``: completions generated per prompt (default 1)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad_request("'n' must be a positive integer", "n")
    return n


def output_hint(body: Mapping[str, Any]) -> int:
    """Chat: ``n`` x (``max_completion_tokens``, else ``max_tokens``); 0 (unknown) if neither,
    as vLLM then generates up to the context length."""
    limit = _max_tokens(body, "max_completion_tokens")
    if limit is None:
        limit = _max_tokens(body, "max_tokens")
    return (limit or 0) * _choices(body)


COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def completions_output_hint(body: Mapping[str, Any], prompts: int) -> int:
    """Completions: ``prompts`` x ``n`` x ``max_tokens`` (absent or null: 16, as in the OpenAI
    API and vLLM; ``max_completion_tokens`` is not a completions parameter and is ignored)."""
    limit = _max_tokens(body, "max_tokens")
    if limit is None:
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    return limit * _choices(body) * prompts


def _canonical_json(value: object, param: str) -> str:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``. A long
    array is encoded one element per call (the same text): a single C call holds the GIL, and
    the gateway computes big bodies' keys on a thread while its event loop serves."""
    try:
        if type(value) is list and len(value) > _SPLIT_ITEMS:
            return "[" + ",".join([_CANONICAL.encode(item) for item in value]) + "]"
        return _CANONICAL.encode(value)
    except (TypeError, ValueError, RecursionError) as err:
        raise bad_request(f"'{param}' is not JSON-serializable", param) from err


def _tool_arguments(args: object, param: str) -> str:
    """Tool-call arguments are a JSON string: re-serialize it canonically when it parses."""
    if not isinstance(args, str):
        raise bad_request(f"'{param}' must be a string", param)
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):
        return args
    return _canonical_json(parsed, param)


# --------------------------------------------------------------------------------------------
# Canonical rendering of chat messages


def _render_part(part: object, param: str) -> str:
    if type(part) is not dict and not isinstance(part, Mapping):
        raise bad_request(f"'{param}' must be an object", param)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise bad_request(f"'{param}.type' must be a string", f"{param}.type")
    if kind in _TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"'{param}.text' must be a string", f"{param}.text")
        return text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if not isinstance(url, str):
            raise bad_request(f"'{param}.image_url.url' must be a string", f"{param}.image_url")
        return f"{_PART}image:{url}{_PART}"
    if kind == "refusal":
        refusal = part.get("refusal")
        if not isinstance(refusal, str):
            raise bad_request(f"'{param}.refusal' must be a string", f"{param}.refusal")
        return refusal
    # Other part kinds (input_audio, file, ...): keyed by their canonical JSON.
    return f"{_PART}{kind}:{_canonical_json(part, param)}{_PART}"


def _render_content(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # vLLM hands the template the parts' texts joined with newlines.
        return "\n".join(_render_part(p, f"{param}[{i}]") for i, p in enumerate(content))
    raise bad_request(f"'{param}' must be a string, an array of content parts or null", param)


def _render_tool_calls(calls: object, param: str) -> str:
    if calls is None:
        return ""
    if not isinstance(calls, list):
        raise bad_request(f"'{param}' must be an array", param)
    out: list[str] = []
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        if not isinstance(call, Mapping):
            raise bad_request(f"'{where}' must be an object", where)
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise bad_request(f"'{where}.function' must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str):
            raise bad_request(f"'{where}.function.name' must be a string", f"{where}.function.name")
        args = _tool_arguments(function.get("arguments", ""), f"{where}.function.arguments")
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise bad_request(f"'{where}.id' must be a string", f"{where}.id")
        out.append(f"{_PART}call:{call_id}:{name}:{args}{_PART}")
    return "".join(out)


def _optional_str(message: Mapping[str, Any], name: str, param: str) -> str:
    value = message.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"'{param}.{name}' must be a string", f"{param}.{name}")
    return value


def validate_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        # ``type() is dict`` first: the ABC check alone costs more than the rest of the loop.
        if type(message) is not dict and not isinstance(message, Mapping):
            raise bad_request(f"'messages[{i}]' must be an object", f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"'messages[{i}].role' must be a string", f"messages[{i}].role")
    return messages


def render_chat_text(body: Mapping[str, Any]) -> str:
    """Canonical text of a chat body: the same for any JSON whitespace or key order."""
    messages = validate_messages(body)
    pieces: list[str] = []
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("'tools' must be an array", "tools")
        pieces.append(f"{_MSG}tools{_FIELD}{_canonical_json(tools, 'tools')}")
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        pieces.append(
            f"{_MSG}{message['role']}{_FIELD}{_optional_str(message, 'name', param)}"
            f"{_FIELD}{_optional_str(message, 'tool_call_id', param)}{_FIELD}"
        )
        pieces.append(_render_content(message.get("content"), f"{param}.content"))
        pieces.append(_render_tool_calls(message.get("tool_calls"), f"{param}.tool_calls"))
    return "".join(pieces)


# --------------------------------------------------------------------------------------------
# Completions prompts


def _is_token_list(value: object) -> bool:
    """A list of ints in [0, 2**64) (bools excluded); empty lists pass."""
    if not isinstance(value, list):
        return False
    if not all(type(t) is int for t in value):
        return False
    return not value or (min(value) >= 0 and max(value) <= _MASK64)


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean request field as vLLM's pydantic models read one declared ``bool`` with a
    default: absent gives the default; anything else but true/false (``null`` too) is a 400."""
    if name not in body:
        return default
    value = body[name]
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return value


def completions_add_special_tokens(body: Mapping[str, Any]) -> bool:
    """vLLM's completions ``add_special_tokens`` (default true: the tokenizer's BOS is added to a
    text prompt; clients that send an already templated prompt set it false)."""
    return bool_field(body, "add_special_tokens", True)


def completions_prompts(body: Mapping[str, Any]) -> list[str] | list[list[int]]:
    """Every prompt of a completions body, validated: a string or one array of token ids is one
    prompt; an array of strings or of token-id arrays is a batch (the engine runs each as its own
    request). Token-id arrays are returned as they are (not copied)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            if not all(isinstance(p, str) for p in prompt):
                raise bad_request("'prompt' array must hold only strings", "prompt")
            return prompt
        if isinstance(first, list):
            if not all(_is_token_list(p) and p for p in prompt):
                raise bad_request(
                    "'prompt' must be an array of non-empty token-id arrays", "prompt"
                )
            return prompt
        if _is_token_list(prompt):
            return [prompt]
    raise bad_request(
        "'prompt' must be a string, an array of strings, token ids or token-id arrays",
        "prompt",
    )
