"""vLLM's sampling-parameter semantics the emulator honours or rejects (pure, no I/O).

- ``stop`` / ``stop_token_ids`` / ``include_stop_str_in_output``: the output text is known in
  advance (``tokenizer.output_text``), so where vLLM would stop is computed at parse time, as
  vLLM's detokenizer and scheduler decide it one token at a time: the choice ends at the first
  output token ``k >= min_tokens`` that is a stop token id or completes a stop string (of
  several, the one that ends first). ``completion_tokens`` counts token ``k``; the text ends
  before the stop string (or after it, with ``include_stop_str_in_output``) and excludes a stop
  token's text; ``finish_reason`` is ``stop`` and ``stop_reason`` the string or the id.
- ``logprobs``, ``top_logprobs``, ``prompt_logprobs`` and ``echo``: the emulator has no real
  logits or detokenizer, so a request that asks for them gets a 400 (after vLLM's own checks)
  rather than a silent ``null``; ``false`` / ``null`` / ``0`` are accepted.
- ``n`` and ``temperature``: vLLM's ``SamplingParams`` checks (``_verify_num_sequences``, the
  temperature range, ``_verify_greedy_sampling``: ``n`` > 1 needs a temperature above 0).
- ``seed``: an int64 (vLLM's bounds); when sampling is not greedy it seeds the output, so the
  same seed gives the same text and another seed another one. Greedy output ignores it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.tokenizer import OUTPUT_WORDS, output_piece, output_token_id

_MAX_TOKEN_ID = (1 << 63) - 1
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
_DEFAULT_TEMPERATURE = 1.0  # vLLM's, for a model without a generation config
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1  # vLLM's bounds of ``seed`` (torch.long)


@dataclass(frozen=True, slots=True)
class StopParams:
    strings: tuple[str, ...] = ()
    token_ids: frozenset[int] = frozenset()
    include_in_output: bool = False


@dataclass(frozen=True, slots=True)
class StopHit:
    """Where a choice stops: ``output_tokens`` generated, text cut to ``text_chars``."""

    output_tokens: int
    text_chars: int
    reason: str | int


def parse_stop(body: Mapping[str, Any]) -> StopParams:
    stop = body.get("stop")
    if stop is None:
        strings: tuple[str, ...] = ()
    elif isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        strings = tuple(stop)
    else:
        raise _bad("'stop' must be a string or an array of strings", "stop")
    if "" in strings:
        raise _bad("stop cannot contain an empty string.", "stop")
    ids = body.get("stop_token_ids")
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKEN_ID for t in ids
    ):
        raise _bad("'stop_token_ids' must be an array of token ids", "stop_token_ids")
    include = body.get("include_stop_str_in_output", False)
    if not isinstance(include, bool):
        raise _bad("'include_stop_str_in_output' must be a boolean", "include_stop_str_in_output")
    return StopParams(strings, frozenset(ids), include)


def find_stop(
    params: StopParams, text_seed: int, output_tokens: int, min_tokens: int
) -> StopHit | None:
    """The first stop within the first ``output_tokens`` output tokens, if any."""
    if not params.strings and not params.token_ids:
        return None
    # The output repeats every len(OUTPUT_WORDS) tokens after the first (an odd word stride),
    # so a stop not found within one period past min_tokens plus the longest stop string
    # (every piece has a character) is never found: bound the scan, not n * max_tokens.
    longest = max(map(len, params.strings), default=0)
    scan = min(output_tokens, min_tokens + 2 * len(OUTPUT_WORDS) + longest + 1)
    text = ""
    for k in range(scan):
        start = len(text)
        text += output_piece(text_seed, k)
        if k < min_tokens:
            continue
        if params.token_ids:
            token_id = output_token_id(text_seed, k)
            if token_id in params.token_ids:
                return StopHit(k + 1, len(text) if params.include_in_output else start, token_id)
        hit = _stop_string_in(text, start, params)
        if hit is not None:
            return StopHit(k + 1, hit[1], hit[0])
    return None


def _stop_string_in(text: str, start: int, params: StopParams) -> tuple[str, int] | None:
    """The stop string that ends earliest after ``start`` (vLLM's ``check_stop_strings``) and
    where the text is cut."""
    best: tuple[str, int] | None = None
    best_end = len(text) + 1
    for stop in params.strings:
        index = text.find(stop, max(0, start - len(stop) + 1))
        if index != -1 and index + len(stop) < best_end:
            best_end = index + len(stop)
            best = (stop, best_end if params.include_in_output else index)
    return best


def _bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def _unsupported(param: str) -> BadRequestError:
    return _bad(
        f"the emulator does not support '{param}' (it has no real logits or detokenizer)", param
    )


def _check_int_logprobs(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer", name)
    if value < 0 and value != -1:
        raise _bad(f"`{name}` must be a positive value or -1.", name)
    return value


def reject_unsupported(body: Mapping[str, Any], kind: Literal["chat", "completion"]) -> None:
    """400 for the logprobs / echo options the emulator cannot honour (vLLM's checks first)."""
    prompt_logprobs = _check_int_logprobs(body, "prompt_logprobs")
    if kind == "chat":
        logprobs = body.get("logprobs", False)
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("'logprobs' must be a boolean", "logprobs")
        top = _check_int_logprobs(body, "top_logprobs")
        if top is not None and top != 0 and not logprobs:
            raise _bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        if logprobs:
            raise _unsupported("logprobs")
    elif _check_int_logprobs(body, "logprobs") is not None:
        raise _unsupported("logprobs")
    if prompt_logprobs is not None:
        raise _unsupported("prompt_logprobs")
    echo = body.get("echo", False)
    if echo is not None and not isinstance(echo, bool):
        raise _bad("'echo' must be a boolean", "echo")
    if echo:
        raise _unsupported("echo")


def _temperature(body: Mapping[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return _DEFAULT_TEMPERATURE
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("'temperature' must be a number", "temperature")
    if not math.isfinite(value):
        raise _bad(f"temperature must be a finite number, got {value}.", "temperature")
    if value < 0:
        raise _bad(f"temperature must be non-negative, got {value}.", "temperature")
    if value > 2:
        raise _bad(f"temperature must be in [0, 2], got {value}.", "temperature")
    return float(value)


def parse_n(body: Mapping[str, Any], kind: Literal["chat", "completion"]) -> int:
    """``n``, the number of choices, checked as vLLM does: an integer (not a boolean) in
    ``[1, MAX_N]``, ``null`` meaning 1 for chat only (``CompletionRequest.n`` is not optional),
    and 1 when sampling is greedy (``temperature`` 0: ``_verify_greedy_sampling``)."""
    n = body.get("n", 1)
    if n is None and kind == "chat":
        n = 1
    if isinstance(n, bool) or not isinstance(n, int):
        raise _bad("'n' must be an integer", "n")
    if n < 1:
        raise _bad(f"n must be at least 1, got {n}.", "n")
    if n > MAX_N:
        raise _bad(f"n must be at most {MAX_N}, got {n}.", "n")
    if _temperature(body) == 0 and n > 1:
        raise _bad(f"n must be 1 when using greedy sampling, got {n}.", "n")
    return n


def parse_seed(body: Mapping[str, Any]) -> int | None:
    """The request's ``seed`` where it changes the output: None when absent, and when sampling
    is greedy (``temperature`` 0: the most likely token does not depend on a seed)."""
    value = body.get("seed")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("'seed' must be an integer", "seed")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _bad(f"seed must be in [{_INT64_MIN}, {_INT64_MAX}], got {value}.", "seed")
    return None if _temperature(body) == 0 else value
