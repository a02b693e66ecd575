"""OpenAI/vLLM wire format of the emulator: request parsing into a ``Job`` (no I/O).

Response bodies are in ``responses``; sampling options (stop, logprobs, echo) in ``sampling``.
"""

from __future__ import annotations

import itertools
import uuid
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from warmfleet.core.errors import BadRequestError, NotFoundError
from warmfleet.emulator.sampling import (
    StopParams,
    find_stop,
    parse_n,
    parse_seed,
    parse_stop,
    reject_unsupported,
)
from warmfleet.emulator.tokenizer import EmulatorTokenizer, hash_seed, prompt_block_hashes_bytes
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
class Choice:
    """One of a request's ``n`` choices: one engine request (a vLLM child request)."""

    index: int
    text_seed: int  # seeds the output text, its emulated EOS and where a stop hits
    output_tokens: int
    finish_reason: str  # "length" (hit max_tokens) or "stop" (emulated EOS, stop string/token)
    stop_reason: str | int | None = None  # the stop string or token id that ended the output
    text_chars: int | None = None  # the output text is cut to this many characters (stop)


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request, ready for the engine: ``n`` choices sharing one prompt."""

    kind: Kind
    response_id: str
    model: str
    prompt_ids: list[int]
    block_hashes: tuple[int, ...]
    choices: tuple[Choice, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage)
    max_tokens: int = 0  # the effective limit (vLLM's max_tokens_param); 0: not known

    @property
    def max_output_tokens(self) -> int:
        return max(choice.output_tokens for choice in self.choices)


@dataclass(frozen=True, slots=True)
class _Limits:
    """A request's output limits, the same for each of its choices."""

    max_tokens: int
    min_tokens: int
    ignore_eos: bool


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


def _limits(body: Mapping[str, Any], kind: Kind, prompt_len: int, ctx: ParseContext) -> _Limits:
    """``max_tokens`` (checked against ``max_model_len``), ``min_tokens`` and ``ignore_eos``."""
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
    return _Limits(max_tokens, min_tokens, _opt_bool(body, "ignore_eos"))


def _choice(
    index: int, text_seed: int, limits: _Limits, stop: StopParams, ctx: ParseContext
) -> Choice:
    """Where choice ``index`` ends: emulated EOS (unless ``ignore_eos``), ``max_tokens``, or
    the first stop string / token id, as vLLM decides each child request on its own."""
    output_tokens, finish_reason = limits.max_tokens, "length"
    if not limits.ignore_eos:
        span = ctx.eos_max_tokens - ctx.eos_min_tokens + 1
        natural = max(ctx.eos_min_tokens + text_seed % span, limits.min_tokens)
        if natural < limits.max_tokens:
            output_tokens, finish_reason = natural, "stop"
    hit = find_stop(stop, text_seed, output_tokens, limits.min_tokens)
    if hit is None:
        return Choice(index, text_seed, output_tokens, finish_reason)
    return Choice(index, text_seed, hit.output_tokens, "stop", hit.reason, hit.text_chars)


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous usage): vLLM sends a running usage on every chunk
    only when both ``include_usage`` and ``continuous_usage_stats`` are set."""
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not isinstance(options, Mapping):
            raise _bad("'stream_options' must be an object", "stream_options")
        if not stream:
            raise _bad("'stream_options' can only be set when 'stream' is true", "stream_options")
        include_usage = _opt_bool(options, "include_usage")
        continuous = include_usage and _opt_bool(options, "continuous_usage_stats")
    return stream, include_usage, continuous


def parse_job(body: object, kind: Kind, ctx: ParseContext) -> Job:
    """Validate a chat/completions body into a ``Job``; BadRequestError/NotFoundError otherwise."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    model = check_model(body, ctx.model)
    n = parse_n(body, kind)
    reject_unsupported(body, kind)
    stop = parse_stop(body)
    ids = prompt_ids(body, kind, ctx.tokenizer)
    stream, include_usage, continuous = _stream_flags(body)
    data = array("Q", ids).tobytes()  # ids are in [0, 2**63) (tokenizer or _token_list)
    limits = _limits(body, kind, len(ids), ctx)
    # choice 0 is what n = 1 gets; the others are other samples of the same prompt; a
    # request's own seed (sampling, not greedy) draws another sample, the same for the same seed
    request_seed = parse_seed(body)
    drawn = data if request_seed is None else data + request_seed.to_bytes(8, "little", signed=True)
    seeds = [xxhash.xxh3_64_intdigest(drawn, seed=index) for index in range(n)]
    choices = tuple(_choice(index, seed, limits, stop, ctx) for index, seed in enumerate(seeds))
    seed = hash_seed(ctx.hash_seed, _cache_salt(body))
    hashes = prompt_block_hashes_bytes(data, ctx.spec.block_tokens, seed)
    return Job(
        kind,
        ctx.new_id(kind),
        model,
        ids,
        hashes,
        choices,
        stream,
        include_usage,
        continuous_usage=continuous,
        max_tokens=limits.max_tokens,
    )


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
