"""A Responses API body (``POST /v1/responses``) as the chat it is: ``responses_messages``.

vLLM serves a Responses request by rendering it as a chat: ``instructions`` first, as a system
message, then the ``input`` (a string: one user message; else its items in order). The gateway
keys that chat like any other (``routing.parse.parse_responses``), and the emulator renders the
same messages, so the key of a Responses request shares its blocks with the chat of the same
conversation whichever API sent it. The items become chat messages:

- a message (``type`` absent or ``"message"``): its ``role`` and ``content`` (a string, or
  content parts: ``input_text`` / ``output_text`` become text parts, ``input_image`` an
  ``image_url`` part, any other part is kept as it is, keyed by its canonical JSON);
- ``function_call``: an assistant message with one tool call (``call_id``, ``name``,
  ``arguments``); ``function_call_output``: a tool message answering ``call_id``;
- any other item (``reasoning``, ``item_reference``, ...): a message whose role is the item's
  type and whose one content part is the item, checked and converted as a content part is
  (keyed by its canonical JSON, or its text for a text item).

Every shape is checked here, each fault a ``BadRequestError`` naming the body's own param
(``input[2].content[0].text``), so the messages need no further check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet.core.errors import BadRequestError

_TEXT = frozenset({"input_text", "output_text", "text"})


def _bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def _string(item: Mapping[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _bad(f"'{where}.{name}' must be a string", f"{where}.{name}")
    return value


def _part(part: object, where: str) -> Mapping[str, Any]:
    """One content part, text and image parts in their chat form."""
    if not isinstance(part, Mapping):
        raise _bad(f"'{where}' must be an object", where)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise _bad(f"'{where}.type' must be a string", f"{where}.type")
    if kind in _TEXT:
        return {"type": "text", "text": _string(part, "text", where)}
    if kind == "input_image":
        url = part.get("image_url")
        if url is None:
            url = part.get("file_id")
        if not isinstance(url, str):
            raise _bad(f"'{where}.image_url' must be a string", f"{where}.image_url")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "refusal":
        _string(part, "refusal", where)
    elif kind == "image_url":  # the chat form, as the chat API checks it
        image = part.get("image_url")
        if not isinstance(image.get("url") if isinstance(image, Mapping) else image, str):
            raise _bad(f"'{where}.image_url.url' must be a string", f"{where}.image_url")
    return part


def _content(content: object, where: str) -> str | list[Mapping[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or an array of content parts", where)
    return [_part(part, f"{where}[{j}]") for j, part in enumerate(content)]


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    kind = item.get("type")
    if kind is None or kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"'{where}.role' must be a non-empty string", f"{where}.role")
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        call = {
            "id": _string(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _string(item, "name", where),
                "arguments": _string(item, "arguments", where),
            },
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        return {
            "role": "tool",
            "tool_call_id": _string(item, "call_id", where),
            "content": _content(item.get("output"), f"{where}.output"),
        }
    if not isinstance(kind, str) or not kind:
        raise _bad(f"'{where}.type' must be a non-empty string", f"{where}.type")
    return {"role": kind, "content": [_part(item, where)]}  # (a text or image item checked too)


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses body (module docstring); ``BadRequestError`` naming
    ``instructions`` or ``input[...]`` otherwise."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list) or not items:
        raise _bad("'input' must be a string or a non-empty array of input items", "input")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise _bad(f"'input[{i}]' must be an object", f"input[{i}]")
        messages.append(_message(item, f"input[{i}]"))
    return messages
