"""Response bodies of the emulator: full responses and pre-serialised SSE chunks (no I/O).

Shapes follow vLLM's OpenAI server: a first chat chunk carrying ``{"role": "assistant",
"content": ""}``, one chunk per output token, ``finish_reason`` (and ``stop_reason``) on the
last token's chunk, with ``stream_options.continuous_usage_stats`` a running ``usage`` on every
chunk, an optional usage chunk with ``"choices": []`` when ``stream_options.include_usage`` is
set, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from warmfleet.emulator.protocol import Job
from warmfleet.emulator.tokenizer import output_piece, output_pieces_json, output_text


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def choice_text(job: Job, completion_tokens: int) -> str:
    text = output_text(job.text_seed, completion_tokens)
    return text if job.text_chars is None else text[: job.text_chars]


def full_response(job: Job, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    text = choice_text(job, completion_tokens)
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
            "stop_reason": job.stop_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": job.finish_reason,
            "stop_reason": job.stop_reason,
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


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class ChunkWriter:
    """Pre-serialised SSE chunks of one streamed response (only the text is encoded per token).

    A job cut by a stop string or token (``text_chars``) or asking for continuous usage takes
    the per-token path (``_slow_tokens``); every other job the pre-joined fast path."""

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
        self._close = b"}," if chat else b","
        tail = b'"logprobs":null,"finish_reason":null'
        if not chat:
            tail += b',"stop_reason":null'
        self._tail = tail + b"}]"
        self._last_tail = b'"logprobs":null,"finish_reason":%s,"stop_reason":%s}]' % (
            _compact(job.finish_reason),
            _compact(job.stop_reason),
        )
        self._between = self._close + self._tail + b"}\n\n" + self._lead
        self._end = self._close + self._tail + b"}\n\n"
        self._last_end = self._close + self._last_tail + b"}\n\n"
        self._slow = job.text_chars is not None or job.continuous_usage
        self._offset = (0, 0)  # (next token index, its first character), for the slow path

    def _usage_tail(self, completion_tokens: int) -> bytes:
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
        """Chat only: the first chunk, with the assistant role and empty content."""
        return (
            self._head
            + b'[{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]'
            + self._usage_tail(0)
        )

    def tokens(self, first_index: int, last_index: int) -> bytes:
        """Chunks for output tokens ``first_index`` .. ``last_index - 1`` (one bytes object)."""
        if last_index <= first_index:
            return b""
        if self._slow:
            return self._slow_tokens(first_index, last_index)
        texts = output_pieces_json(self.job.text_seed, first_index, last_index)
        end = self._last_end if last_index == self.job.output_tokens else self._end
        return self._lead + self._between.join(texts) + end

    def _slow_tokens(self, first_index: int, last_index: int) -> bytes:
        job = self.job
        index, start = self._offset
        if index != first_index:
            index, start = first_index, len(output_text(job.text_seed, first_index))
        limit = sys.maxsize if job.text_chars is None else job.text_chars
        out: list[bytes] = []
        for i in range(index, last_index):
            piece = output_piece(job.text_seed, i)
            text = piece[: max(0, limit - start)]
            start += len(piece)
            tail = self._last_tail if i == job.output_tokens - 1 else self._tail
            out.append(self._lead + _compact(text) + self._close + tail + self._usage_tail(i + 1))
        self._offset = (last_index, start)
        return b"".join(out)

    def usage(self, completion_tokens: int, cached_tokens: int) -> bytes:
        body = usage(len(self.job.prompt_ids), completion_tokens, cached_tokens)
        return self._head + b'[],"usage":' + _compact(body) + b"}\n\n"
