"""Response bodies of the emulator: full responses and pre-serialised SSE chunks (no I/O).

Shapes follow vLLM's OpenAI server: per choice (``index`` 0 .. n-1) a first chat chunk
carrying ``{"role": "assistant", "content": ""}``, one chunk per output token, ``finish_reason``
(and ``stop_reason``) on the last token's chunk, with ``stream_options.continuous_usage_stats``
a running ``usage`` (that choice's tokens) on every chunk; then one usage chunk with
``"choices": []`` when ``stream_options.include_usage`` is set, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from warmfleet.emulator.protocol import Choice, Job
from warmfleet.emulator.tokenizer import output_piece, output_pieces_json, output_text


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def choice_text(choice: Choice) -> str:
    text = output_text(choice.text_seed, choice.output_tokens)
    return text if choice.text_chars is None else text[: choice.text_chars]


def _choice_body(kind: str, choice: Choice) -> dict[str, Any]:
    text = choice_text(choice)
    if kind == "chat":
        return {
            "index": choice.index,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
    return {
        "index": choice.index,
        "text": text,
        "logprobs": None,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "prompt_logprobs": None,
    }


def full_response(job: Job, cached_tokens: int) -> dict[str, Any]:
    """Every choice, in index order; the prompt is counted once, the completions summed."""
    completion_tokens = sum(choice.output_tokens for choice in job.choices)
    return {
        "id": job.response_id,
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": job.model,
        "choices": [_choice_body(job.kind, choice) for choice in job.choices],
        "usage": usage(len(job.prompt_ids), completion_tokens, cached_tokens),
        "system_fingerprint": None,
    }


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class ChunkWriter:
    """Pre-serialised SSE chunks of one choice of a streamed response (only the text is encoded
    per token); ``writers(job)`` makes one per choice, sharing ``created``.

    A choice cut by a stop string or token (``text_chars``) or a job asking for continuous usage
    takes the per-token path (``_slow_tokens``); every other the pre-joined fast path."""

    def __init__(self, job: Job, choice: Choice | None = None, created: int | None = None) -> None:
        self.job = job
        self.choice = choice = job.choices[0] if choice is None else choice
        chat = job.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time()) if created is None else created
        self._head = (
            f'data: {{"id":"{job.response_id}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(job.model)},"choices":'
        ).encode()
        self._index = b'[{"index":%d,' % choice.index
        self._lead = self._head + self._index + (b'"delta":{"content":' if chat else b'"text":')
        self._close = b"}," if chat else b","
        tail = b'"logprobs":null,"finish_reason":null'
        if not chat:
            tail += b',"stop_reason":null'
        self._tail = tail + b"}]"
        self._last_tail = b'"logprobs":null,"finish_reason":%s,"stop_reason":%s}]' % (
            _compact(choice.finish_reason),
            _compact(choice.stop_reason),
        )
        self._between = self._close + self._tail + b"}\n\n" + self._lead
        self._end = self._close + self._tail + b"}\n\n"
        self._last_end = self._close + self._last_tail + b"}\n\n"
        self._slow = choice.text_chars is not None or job.continuous_usage
        self._offset = (0, 0)  # (next token index, its first character), for the slow path

    def _usage_tail(self, completion_tokens: int) -> bytes:
        """vLLM's continuous usage: the prompt and this choice's tokens so far."""
        if not self.job.continuous_usage:
            return b"}\n\n"
        prompt = len(self.job.prompt_ids)
        return b',"usage":%s}\n\n' % _compact(
            {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion_tokens,
                "completion_tokens": completion_tokens,
            }
        )

    def role(self) -> bytes:
        """Chat only: the choice's first chunk, with the assistant role and empty content."""
        return (
            self._head
            + self._index
            + b'"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]'
            + self._usage_tail(0)
        )

    def tokens(self, first_index: int, last_index: int) -> bytes:
        """Chunks for output tokens ``first_index`` .. ``last_index - 1`` (one bytes object)."""
        if last_index <= first_index:
            return b""
        if self._slow:
            return self._slow_tokens(first_index, last_index)
        choice = self.choice
        texts = output_pieces_json(choice.text_seed, first_index, last_index)
        end = self._last_end if last_index == choice.output_tokens else self._end
        return self._lead + self._between.join(texts) + end

    def _slow_tokens(self, first_index: int, last_index: int) -> bytes:
        choice = self.choice
        index, start = self._offset
        if index != first_index:
            index, start = first_index, len(output_text(choice.text_seed, first_index))
        limit = sys.maxsize if choice.text_chars is None else choice.text_chars
        out: list[bytes] = []
        for i in range(index, last_index):
            piece = output_piece(choice.text_seed, i)
            text = piece[: max(0, limit - start)]
            start += len(piece)
            tail = self._last_tail if i == choice.output_tokens - 1 else self._tail
            out.append(self._lead + _compact(text) + self._close + tail + self._usage_tail(i + 1))
        self._offset = (last_index, start)
        return b"".join(out)

    def usage(self, completion_tokens: int, cached_tokens: int) -> bytes:
        """The final usage chunk (``"choices": []``) of the whole response."""
        body = usage(len(self.job.prompt_ids), completion_tokens, cached_tokens)
        return self._head + b'[],"usage":' + _compact(body) + b"}\n\n"


def writers(job: Job) -> list[ChunkWriter]:
    """One ``ChunkWriter`` per choice, in index order."""
    created = int(time.time())
    return [ChunkWriter(job, choice, created) for choice in job.choices]
