"""The canonical text of a chat (``text`` and ``bytes`` keys): the same for any JSON whitespace
or key order.

``tools`` (canonical JSON), then per message: role, ``name``, ``tool_call_id``, content (text and
refusal parts joined with newlines, as vLLM joins text parts; ``image_url`` parts by URL; other
parts by their canonical JSON) and ``tool_calls`` (id, function name, arguments re-serialized
canonically when they parse as JSON), with control characters as separators. It renders a
``ChatRequest``, whose shapes ``routing.parse`` has checked; the only error left is a value that
is not JSON (possible only for bodies built in Python, never for parsed ones).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from warmfleet.core.jsonio import loads_text_yielding
from warmfleet.routing.parse import TEXT_PARTS, bad_request
from warmfleet.routing.request import ChatRequest

# Separators of the canonical rendering; control characters that JSON text rarely contains.
_MSG = "\x1e"
_FIELD = "\x1f"
_PART = "\x1d"
# Canonical JSON (stateless between calls: safe from several threads). A container longer than
# _SPLIT_ITEMS, or holding another container, is encoded element by element; the rest (scalars
# and short flat containers) in one C call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_SPLIT_ITEMS = 16
# Tool-call arguments longer than this are parsed by the yielding scanner when they may hold
# many values (``jsonio.loads_text_yielding``); shorter ones cannot hold enough to matter.
_ARGS_YIELD_CHARS = 64 << 10


def _canonical_json(value: object, param: str) -> str:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, the
    same text. A single C call holds the GIL, and the gateway computes big bodies' keys on a
    thread while its event loop serves: nested or long containers are encoded one element per
    call (``_encode``), so no call covers more than a short flat container or one scalar."""
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError) as err:
        raise bad_request(f"'{param}' is not JSON-serializable", param) from err


def _flat(items: Sequence[object]) -> bool:
    if len(items) > _SPLIT_ITEMS:
        return False
    return not [item for item in items if type(item) is list or type(item) is dict]


def _encode(value: object) -> str:
    encode = _CANONICAL.encode
    if type(value) is list:
        if _flat(value):
            return encode(value)
        return "[" + ",".join([_encode(item) for item in value]) + "]"
    if type(value) is dict:
        if _flat(list(value.values())):
            return encode(value)
        if not all(type(k) is str for k in value):  # what json does with other keys
            return encode(value)
        pairs = sorted(value.items())
        return "{" + ",".join([encode(k) + ":" + _encode(v) for k, v in pairs]) + "}"
    return encode(value)


def _tool_arguments(args: str, param: str) -> str:
    """Tool-call arguments are a JSON string: re-serialize it canonically when it parses."""
    try:
        parsed = loads_text_yielding(args) if len(args) > _ARGS_YIELD_CHARS else json.loads(args)
    except (ValueError, RecursionError):
        return args
    return _canonical_json(parsed, param)


def _render_part(part: Mapping[str, Any], index: int, position: int) -> str:
    kind = part["type"]
    if kind in TEXT_PARTS:
        text: str = part["text"]
        return text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        return f"{_PART}image:{url}{_PART}"
    if kind == "refusal":
        refusal: str = part["refusal"]
        return refusal
    param = f"messages[{index}].content[{position}]"
    return f"{_PART}{kind}:{_canonical_json(part, param)}{_PART}"


def _render_content(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    assert isinstance(content, list)  # routing.parse checked it
    # vLLM hands the template the parts' texts joined with newlines.
    return "\n".join([_render_part(p, index, j) for j, p in enumerate(content)])


def _render_tool_calls(calls: Sequence[Mapping[str, Any]], index: int) -> str:
    out: list[str] = []
    for j, call in enumerate(calls):
        function = call["function"]
        param = f"messages[{index}].tool_calls[{j}].function.arguments"
        args = _tool_arguments(function.get("arguments", ""), param)
        out.append(f"{_PART}call:{call.get('id', '')}:{function['name']}:{args}{_PART}")
    return "".join(out)


def render_chat_text(request: ChatRequest) -> str:
    """The canonical text of a parsed chat."""
    pieces: list[str] = []
    tools = request.tools
    if tools is not None:
        pieces.append(f"{_MSG}tools{_FIELD}{_canonical_json(tools, 'tools')}")
    for i, message in enumerate(request.messages):
        get = message.get
        pieces.append(
            f"{_MSG}{message['role']}{_FIELD}{get('name') or ''}"
            f"{_FIELD}{get('tool_call_id') or ''}{_FIELD}"
        )
        content = get("content")
        pieces.append(content if type(content) is str else _render_content(content, i))
        calls = get("tool_calls")
        if calls is not None:
            pieces.append(_render_tool_calls(calls, i))
    return "".join(pieces)
