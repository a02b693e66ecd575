"""The Responses API of the emulator (``POST /v1/responses``), served as the chat it renders.

As vLLM does, a Responses request is a chat: ``instructions`` and ``input`` become its messages
(``routing.responses_input``, the gateway keys the same ones), ``max_output_tokens`` its
``max_tokens``, ``tools`` are rendered into the prompt. The answer has the shapes of the
official client's ``openai.types.responses``: a ``response`` object whose ``output`` is one
assistant message with one ``output_text`` part (``status`` ``incomplete`` with reason
``max_output_tokens`` when the output hit it), and, streamed, the typed SSE events
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per token,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done`` and
``response.completed`` (numbered by ``sequence_number``; no ``[DONE]``). The emulator stores no
responses: ``previous_response_id`` is a 400.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.generation import SSE_HEADERS, Generation
from warmfleet.emulator.protocol import Job, ParseContext, error_body, parse_job
from warmfleet.emulator.responses import choice_text
from warmfleet.emulator.tokenizer import output_piece
from warmfleet.routing.responses_input import responses_messages

_REJECTED = "the request cannot fit this engine"
# Request fields a Responses request passes to the chat it renders, by their chat name.
_CHAT_FIELDS = {
    "model": "model",
    "stream": "stream",
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "cache_salt": "cache_salt",
    "tools": "tools",
}
# Request fields echoed in the response object, with their defaults.
_ECHOED: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": None,
    "parallel_tool_calls": True,
    "temperature": None,
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
}


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    """One Responses request: its chat job and the request fields the response echoes."""

    job: Job
    echoed: dict[str, Any]
    created_at: int

    @property
    def item_id(self) -> str:
        return "msg_" + self.job.response_id.removeprefix("resp_")

    def response(self, status: str, cached_tokens: int = 0) -> dict[str, Any]:
        """The response object: ``in_progress`` (no output yet) or finished (``completed``)."""
        job = self.job
        choice = job.choices[0]
        body: dict[str, Any] = {
            "id": job.response_id,
            "object": "response",
            "created_at": self.created_at,
            "model": job.model,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "output": [],
            "usage": None,
            **self.echoed,
        }
        if status == "in_progress":
            return body
        if choice.finish_reason == "length":
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["output"] = [self.message("completed", choice_text(choice))]
        prompt = len(job.prompt_ids)
        body["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": choice.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + choice.output_tokens,
        }
        return body

    def message(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [_text_part(text)]
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def responses_call(body: object, ctx: ParseContext) -> ResponsesCall:
    """Validate a Responses body into its call; ``BadRequestError``/``NotFoundError`` else."""
    if not isinstance(body, Mapping):
        raise BadRequestError("the request body must be a JSON object", param="body")
    if body.get("previous_response_id") is not None:
        raise BadRequestError(
            "the emulator stores no responses: send the conversation in 'input'",
            param="previous_response_id",
        )
    limit = body.get("max_output_tokens")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise BadRequestError(
            "'max_output_tokens' must be an integer >= 1", param="max_output_tokens"
        )
    chat = {name: body[field] for field, name in _CHAT_FIELDS.items() if field in body}
    chat["messages"] = responses_messages(body)
    try:
        job = parse_job(chat, "chat", ctx)
    except BadRequestError as err:  # named by its chat field: name the Responses one
        if err.param != "max_tokens":
            raise
        raise BadRequestError(str(err), param="max_output_tokens") from err
    job = replace(job, response_id="resp_" + job.response_id.removeprefix("chatcmpl-"))
    echoed = {name: body.get(name, default) for name, default in _ECHOED.items()}
    _check_echoed(echoed)
    return ResponsesCall(job, echoed, int(time.time()))


def _check_echoed(echoed: Mapping[str, Any]) -> None:
    """The echoed fields the chat did not check, with the types of vLLM's ResponsesRequest:
    an unchecked value could be NaN (not JSON in the answer) or nested too deeply to serialise
    (a 500 once the generation ran)."""
    metadata = echoed["metadata"]
    if metadata is not None and (
        not isinstance(metadata, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise BadRequestError("'metadata' must be an object of strings", param="metadata")
    top_p = echoed["top_p"]
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1
    ):
        raise BadRequestError("'top_p' must be a number in (0, 1]", param="top_p")
    parallel = echoed["parallel_tool_calls"]
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequestError(
            "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls"
        )
    choice = echoed["tool_choice"]
    if choice is not None and not isinstance(choice, str | Mapping):
        raise BadRequestError("'tool_choice' must be a string or an object", param="tool_choice")
    if not _shallow_finite(choice, _MAX_ECHO_DEPTH):
        raise BadRequestError(
            f"'tool_choice' must be finite and nested at most {_MAX_ECHO_DEPTH} levels",
            param="tool_choice",
        )


_MAX_ECHO_DEPTH = 32  # OpenAI's tool_choice objects have 3 levels at most


def _shallow_finite(value: object, depth: int) -> bool:
    """No NaN/Infinity and at most ``depth`` levels of nesting (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, Mapping | list):
            if level > depth:
                return False
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, level + 1) for child in children)
    return True


class _Events:
    """The typed SSE events of one streamed response, numbered in order."""

    def __init__(self, call: ResponsesCall) -> None:
        self.call = call
        self.sequence = 0
        self.where = {"item_id": call.item_id, "output_index": 0, "content_index": 0}

    def event(self, kind: str, **fields: Any) -> bytes:
        fields["type"] = kind
        fields["sequence_number"] = self.sequence
        self.sequence += 1
        data = json.dumps(fields, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def opening(self) -> bytes:
        response = self.call.response("in_progress")
        return self.event("response.created", response=response) + self.event(
            "response.in_progress", response=response
        )

    def first_token(self) -> bytes:
        return self.event(
            "response.output_item.added",
            output_index=0,
            item=self.call.message("in_progress", None),
        ) + self.event("response.content_part.added", part=_text_part(""), **self.where)

    def deltas(self, first_index: int, last_index: int) -> bytes:
        seed = self.call.job.choices[0].text_seed
        return b"".join(
            self.event(
                "response.output_text.delta",
                delta=output_piece(seed, i),
                logprobs=[],
                **self.where,
            )
            for i in range(first_index, last_index)
        )

    def closing(self, cached_tokens: int) -> bytes:
        call = self.call
        text = choice_text(call.job.choices[0])
        return b"".join(
            (
                self.event("response.output_text.done", text=text, logprobs=[], **self.where),
                self.event("response.content_part.done", part=_text_part(text), **self.where),
                self.event(
                    "response.output_item.done",
                    output_index=0,
                    item=call.message("completed", text),
                ),
                self.event("response.completed", response=call.response("done", cached_tokens)),
            )
        )


async def serve_responses(
    request: web.Request, gen: Generation, call: ResponsesCall
) -> web.StreamResponse:
    """Answer a Responses request from its generation: whole, or streamed as typed events."""
    if not gen.job.stream:
        while not gen.done:
            if (await gen.next_update()).rejected:
                return web.json_response(error_body(_REJECTED, 400), status=400)
        return web.json_response(call.response("done", gen.last_cached))
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    events = _Events(call)
    await resp.write(events.opening())
    sent = 0
    while True:
        update = await gen.next_update()
        if update.rejected:
            error = {"code": "400", "message": _REJECTED, "param": None}
            await resp.write_eof(events.event("error", **error))
            return resp
        out = [events.first_token()] if update.first_token else []
        if update.touched:
            out.append(events.deltas(sent, gen.produced[0]))
            sent = gen.produced[0]
        if gen.done:
            out.append(events.closing(gen.first_cached or 0))
            await resp.write_eof(b"".join(out))
            return resp
        if out:
            await resp.write(b"".join(out))
