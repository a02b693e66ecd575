"""Chained block hashes over a prompt's bytes (the scheme of ``core.hashing.chain_blocks``):
``chain_buffer`` computes them, ``SpanMemo`` memoises them per span of blocks so shared prompt
prefixes cost one hash per span. Pure; used by the routing keys and the emulator."""

from __future__ import annotations

import xxhash

_SPAN_CACHE_ENTRIES = 8192
_h64 = xxhash.xxh3_64_intdigest
_h128 = xxhash.xxh3_128_intdigest


def chain_buffer(
    data: bytes, unit_bytes: int, block_units: int, max_blocks: int, seed: int
) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``data`` (the scheme of ``hashing.chain_blocks``)."""
    step = unit_bytes * block_units
    end = min(len(data) - len(data) % step, max_blocks * step)
    return tuple(_chain(data, 0, end, step, seed))


def _chain(data: bytes, start: int, end: int, step: int, seed: int) -> list[int]:
    """h[i] = H(data[block i], seed=h[i-1]) for the blocks in [start, end); h[-1] = seed."""
    h = _h64
    prev = seed
    return [prev := h(data[i : i + step], prev) for i in range(start, end, step)]


class SpanMemo:
    """Memo of chained block hashes over spans of ``SPAN_BLOCKS`` blocks.

    A span's hashes depend only on the chain value before it and on its bytes, so they are
    memoised under one 128-bit key of both (``xxh3_128(span bytes) ^ previous value``; unseeded
    because a seeded xxh3_128 over >240 bytes derives a secret per call, 2x slower; no raw text
    is kept). Shared prompt prefixes then cost one hash per span instead of one
    per block; the result is exactly ``chain_buffer``'s. Bounded: cleared when full.
    """

    SPAN_BLOCKS = 8

    __slots__ = ("_spans", "max_entries")

    def __init__(self, max_entries: int = _SPAN_CACHE_ENTRIES) -> None:
        self._spans: dict[int, list[int]] = {}
        self.max_entries = max_entries

    def __len__(self) -> int:
        return len(self._spans)

    def chain(self, data: bytes, step: int, n_blocks: int, seed: int) -> tuple[int, ...]:
        """The same as ``chain_buffer`` over the first ``n_blocks`` blocks of ``step`` bytes."""
        span = step * self.SPAN_BLOCKS
        spans_end = (n_blocks // self.SPAN_BLOCKS) * span
        spans = self._spans
        out: list[int] = []
        prev = seed
        for start in range(0, spans_end, span):
            chunk = data[start : start + span]
            key = _h128(chunk) ^ prev
            hashes = spans.get(key)
            if hashes is None:
                hashes = _chain(chunk, 0, span, step, prev)
                if len(spans) >= self.max_entries:
                    spans.clear()
                spans[key] = hashes
            out += hashes
            prev = hashes[-1]
        if spans_end < n_blocks * step:
            out += _chain(data, spans_end, n_blocks * step, step, prev)
        return tuple(out)
