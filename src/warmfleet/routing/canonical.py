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

from warmfleet.routing.parse import TEXT_PARTS, bad_request
from warmfleet.routing.request import ChatRequest

# Separators of the canonical rendering; control characters that JSON text rarely contains.
_MSG = "\x1e"
_FIELD = "\x1f"
_PART = "\x1d"
# Canonical JSON (stateless between calls: safe from several threads); arrays longer than
# _SPLIT_ITEMS are encoded element by element.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_SPLIT_ITEMS = 16


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


def _tool_arguments(args: str, param: str) -> str:
    """Tool-call arguments are a JSON string: re-serialize it canonically when it parses."""
    try:
        parsed = json.loads(args)
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
