"""OpenAI/vLLM wire format of the emulator: request parsing and response shapes (no I/O).

Shapes follow vLLM's OpenAI server: ``chatcmpl-``/``cmpl-`` ids, a first chat chunk carrying
``{"role": "assistant", "content": ""}``, one chunk per output token, ``finish_reason`` on the
last token's chunk, an optional usage chunk with ``"choices": []`` when
``stream_options.include_usage`` is set, then ``data: [DONE]``.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from warmfleet.core.errors import BadRequestError, NotFoundError
from warmfleet.emulator.tokenizer import (
    EmulatorTokenizer,
    hash_seed,
    output_pieces_json,
    output_text,
    prompt_block_hashes_bytes,
)
from warmfleet.engine.spec import EngineSpec

Kind = Literal["chat", "completion"]
DONE = b"data: [DONE]\n\n"
_MAX_TOKEN_ID = (1 << 63) - 1
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default


@dataclass(frozen=True, slots=True)
class ParseContext:
    tokenizer: EmulatorTokenizer
    spec: EngineSpec
    model: str
    hash_seed: int
    eos_min_tokens: int
    eos_max_tokens: int
    id_prefix: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    serials: Iterator[int] = field(default_factory=itertools.count)

    def new_id(self, kind: Kind) -> str:
        """``chatcmpl-``/``cmpl-`` + a per-instance random prefix + a serial (cheap, unique)."""
        head = "chatcmpl-" if kind == "chat" else "cmpl-"
        return f"{head}{self.id_prefix}{next(self.serials):020x}"


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request, ready for the engine."""

    kind: Kind
    response_id: str
    model: str
    prompt_ids: list[int]
    block_hashes: tuple[int, ...]
    output_tokens: int
    finish_reason: str  # "length" (hit max_tokens) or "stop" (emulated EOS)
    stream: bool
    include_usage: bool
    text_seed: int


def _bad(message: str, param: str | None = None) -> BadRequestError:
    return BadRequestError(message, param=param)


def _opt_int(body: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(f"'{name}' must be an integer >= {minimum}", name)
    return value


def _opt_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be a boolean", name)
    return value


def check_model(body: Mapping[str, Any], model: str) -> str:
    name = body.get("model", model)
    if name is None:
        return model
    if not isinstance(name, str):
        raise _bad("'model' must be a string", "model")
    if name != model:
        raise NotFoundError(f"The model `{name}` does not exist.")
    return name


def _token_list(value: object) -> list[int] | None:
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKEN_ID
            for t in value
        )
    ):
        return list(value)
    return None


def completion_prompt_ids(body: Mapping[str, Any], tokenizer: EmulatorTokenizer) -> list[int]:
    """Token ids of a completions ``prompt`` (one prompt per request)."""
    prompt = body.get("prompt")
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise _bad("'add_special_tokens' must be a boolean", "add_special_tokens")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' must not be empty", "prompt")
        return tokenizer.encode_prompt(prompt, add_special)
    ids = _token_list(prompt)
    if ids is None:
        raise _bad(
            "'prompt' must be a non-empty string or token-id array (one prompt per request)",
            "prompt",
        )
    return ids


def chat_prompt_ids(body: Mapping[str, Any], tokenizer: EmulatorTokenizer) -> list[int]:
    messages = body.get("messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _bad("'tools' must be an array", "tools")
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise _bad("'add_generation_prompt' must be a boolean", "add_generation_prompt")
    if not isinstance(messages, list):
        raise _bad("'messages' must be a non-empty array", "messages")
    return tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)


def prompt_ids(body: Mapping[str, Any], kind: Kind, tokenizer: EmulatorTokenizer) -> list[int]:
    if kind == "chat":
        return chat_prompt_ids(body, tokenizer)
    return completion_prompt_ids(body, tokenizer)


def _cache_salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise _bad("'cache_salt' must be a non-empty string", "cache_salt")
    return salt


def _requested_max_tokens(body: Mapping[str, Any], kind: Kind) -> int | None:
    """vLLM's limit: chat reads ``max_completion_tokens`` then ``max_tokens`` (default: none);
    completions read only ``max_tokens``, 16 when absent (an explicit null: none)."""
    if kind == "chat":
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        return max_tokens if max_tokens is not None else _opt_int(body, "max_tokens", 1)
    if "max_tokens" not in body:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    return _opt_int(body, "max_tokens", 1)


def _output_tokens(
    body: Mapping[str, Any], kind: Kind, prompt_len: int, text_seed: int, ctx: ParseContext
) -> tuple[int, str]:
    limit = ctx.spec.max_model_len
    max_tokens = _requested_max_tokens(body, kind)
    if max_tokens is None:
        max_tokens = limit - prompt_len
    if prompt_len + max(max_tokens, 1) > limit:
        raise _bad(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise _bad(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            "min_tokens",
        )
    if _opt_bool(body, "ignore_eos"):
        return max_tokens, "length"
    span = ctx.eos_max_tokens - ctx.eos_min_tokens + 1
    natural = max(ctx.eos_min_tokens + text_seed % span, min_tokens)
    if natural >= max_tokens:
        return max_tokens, "length"
    return natural, "stop"


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, Mapping):
            raise _bad("'stream_options' must be an object", "stream_options")
        if not stream:
            raise _bad("'stream_options' can only be set when 'stream' is true", "stream_options")
        include_usage = _opt_bool(options, "include_usage")
    return stream, include_usage


def parse_job(body: object, kind: Kind, ctx: ParseContext) -> Job:
    """Validate a chat/completions body into a ``Job``; BadRequestError/NotFoundError otherwise."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    model = check_model(body, ctx.model)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise _bad("the emulator supports only 'n': 1", "n")
    ids = prompt_ids(body, kind, ctx.tokenizer)
    stream, include_usage = _stream_flags(body)
    data = array("Q", ids).tobytes()  # ids are in [0, 2**63) (tokenizer or _token_list)
    text_seed = xxhash.xxh3_64_intdigest(data)
    output_tokens, finish_reason = _output_tokens(body, kind, len(ids), text_seed, ctx)
    seed = hash_seed(ctx.hash_seed, _cache_salt(body))
    hashes = prompt_block_hashes_bytes(data, ctx.spec.block_tokens, seed)
    return Job(
        kind,
        ctx.new_id(kind),
        model,
        ids,
        hashes,
        output_tokens,
        finish_reason,
        stream,
        include_usage,
        text_seed,
    )


# --------------------------------------------------------------------------------------------
# Responses


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def full_response(job: Job, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    text = output_text(job.text_seed, completion_tokens)
    choice: dict[str, Any]
    if job.kind == "chat":
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": job.finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": job.finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    return {
        "id": job.response_id,
        "object": obj,
        "created": int(time.time()),
        "model": job.model,
        "choices": [choice],
        "usage": usage(len(job.prompt_ids), completion_tokens, cached_tokens),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """Pre-serialised SSE chunks of one streamed response (only the text is encoded per token)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        chat = job.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            f'data: {{"id":"{job.response_id}","object":"{obj}","created":{int(time.time())},'
            f'"model":{json.dumps(job.model)},"choices":'
        ).encode()
        self._lead = self._head + (
            b'[{"index":0,"delta":{"content":' if chat else b'[{"index":0,"text":'
        )
        close = b"}," if chat else b","
        tail = b'"logprobs":null,"finish_reason":null}]}\n\n'
        if not chat:
            tail = b'"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        last_tail = b'"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n' % (
            job.finish_reason.encode()
        )
        self._between = close + tail + self._lead  # from one token's text to the next one's
        self._end = close + tail
        self._last_end = close + last_tail  # the last output token's chunk carries the reason

    def role(self) -> bytes:
        """Chat only: the first chunk, with the assistant role and empty content."""
        return (
            self._head
            + b'[{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def tokens(self, first_index: int, last_index: int) -> bytes:
        """Chunks for output tokens ``first_index`` .. ``last_index - 1`` (one bytes object)."""
        if last_index <= first_index:
            return b""
        texts = output_pieces_json(self.job.text_seed, first_index, last_index)
        end = self._last_end if last_index == self.job.output_tokens else self._end
        return self._lead + self._between.join(texts) + end

    def usage(self, completion_tokens: int, cached_tokens: int) -> bytes:
        body = usage(len(self.job.prompt_ids), completion_tokens, cached_tokens)
        usage_json = json.dumps(body, separators=(",", ":")).encode()
        return self._head + b'[],"usage":' + usage_json + b"}\n\n"


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kinds = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
    return {
        "error": {
            "message": message,
            "type": kinds.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }


def tokenize_ids(body: object, ctx: ParseContext) -> list[int]:
    """/tokenize: ``prompt`` (text) or ``messages`` (through the chat template)."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    check_model(body, ctx.model)
    if "messages" in body:
        return chat_prompt_ids(body, ctx.tokenizer)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise _bad("'prompt' must be a string (or send 'messages')", "prompt")
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise _bad("'add_special_tokens' must be a boolean", "add_special_tokens")
    return ctx.tokenizer.encode_prompt(prompt, add_special)
