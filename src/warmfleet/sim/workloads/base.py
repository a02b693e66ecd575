"""Workload request model, shared by the simulator (blocks) and the load generator (text).

A prompt is a sequence of ``Segment``s: runs of tokens with a content identity. Two prompts that
begin with the same segments share a prefix. The simulator turns segments into chained block
hashes of ``block_tokens`` tokens (``prompt_blocks``); the live load generator renders each
segment to deterministic text (``render_segment_text``: one word per token), so the same
workload drives both.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from warmfleet.core.hashing import chain_seed, hash_bytes


@dataclass(frozen=True, slots=True)
class Segment:
    """``tokens`` tokens whose content is identified by ``content_id``."""

    content_id: int
    tokens: int


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One request of a workload.

    ``arrival_s`` is the open-loop arrival time (ignored in closed loop). Requests of one
    ``session_id`` are turns of one conversation: in closed loop a turn is sent only after the
    previous turn of the same session finished. ``tenant`` seeds the block hash chain (no
    reuse across tenants, as in the gateway); ``priority`` and ``deadline_ms`` (after arrival)
    are carried from a trace, acted on by flow control when the run has it (``warmfleet.flow``).
    """

    request_id: int
    arrival_s: float
    segments: tuple[Segment, ...]
    output_tokens: int
    session_id: int | None = None
    tenant: str | None = None
    priority: int | None = None
    deadline_ms: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)


def prompt_blocks(segments: Sequence[Segment], block_tokens: int, seed: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's *full* blocks of ``block_tokens`` tokens.

    A block's identity is the list of (content_id, start, end) token ranges it covers, so a
    block spanning two segments differs from one spanning two other segments. The chain starts
    at ``seed`` (fold salt, model and tenant into it with ``chain_seed``).
    """
    out: list[int] = []
    prev = seed
    pieces: list[bytes] = []
    filled = 0
    for seg in segments:
        offset = 0
        while offset < seg.tokens:
            take = min(seg.tokens - offset, block_tokens - filled)
            pieces.append(b"%d:%d:%d;" % (seg.content_id, offset, offset + take))
            offset += take
            filled += take
            if filled == block_tokens:
                prev = hash_bytes(b"".join(pieces), prev)
                out.append(prev)
                pieces.clear()
                filled = 0
    return tuple(out)


_VOCAB = (
    "the of and to in is was for that on as with by at from his it an were are which this be "
    "or has had not first one their its new after who they have two her she been other when "
    "there all during into school time may years more most only over city some world would "
    "where later up such used many can state about national out known university united then "
    "made these film age high part well through year under both between three river system"
).split()


def render_segment_text(segment: Segment) -> str:
    """Deterministic text of ``segment.tokens`` words for ``segment.content_id``."""
    rng = random.Random(segment.content_id)
    return " ".join(rng.choice(_VOCAB) for _ in range(segment.tokens))


def render_prompt_text(segments: Sequence[Segment]) -> str:
    return " ".join(render_segment_text(s) for s in segments)


def default_seed(
    salt: str = "warmfleet-sim", model: str = "model", tenant: str | None = None
) -> int:
    return chain_seed(salt, model, None, tenant)


class PrefixBlockHasher:
    """``prompt_blocks`` with memoised chain state at segment boundaries.

    Workloads share long prefixes (a system prompt, a growing conversation), so hashing every
    prompt from scratch repeats work; this object remembers the hashing state after each distinct
    segment prefix (keyed by a 64-bit chained id of the segments so far) and resumes from the
    longest one seen. Results equal ``prompt_blocks(segments, block_tokens, seed)``.
    """

    def __init__(self, block_tokens: int, seed: int, max_states: int = 1 << 18) -> None:
        self.block_tokens = block_tokens
        self.seed = seed
        self._max_states = max_states
        # segment-prefix id -> (a prompt's blocks, how many of them are this prefix's, chain
        # value, pending pieces, tokens pending); a prompt's states share its list of blocks
        # (a copy each was quadratic: 160 kB for a prompt of 200 one-block segments)
        self._states: dict[int, tuple[list[int], int, int, tuple[bytes, ...], int]] = {}

    def blocks(self, segments: Sequence[Segment]) -> tuple[int, ...]:
        ids: list[int] = []
        prefix_id = self.seed
        for seg in segments:
            prefix_id = hash_bytes(b"%d:%d" % (seg.content_id, seg.tokens), prefix_id)
            ids.append(prefix_id)
        start = len(segments)
        state: tuple[list[int], int, int, tuple[bytes, ...], int] = ([], 0, self.seed, (), 0)
        while start > 0:
            found = self._states.get(ids[start - 1])
            if found is not None:
                state = found
                break
            start -= 1
        out, held, prev, pieces_t, filled = state
        out_l = out[:held]  # (never appended to: another prompt's states hold it)
        pieces = list(pieces_t)
        for index in range(start, len(segments)):
            seg = segments[index]
            offset = 0
            while offset < seg.tokens:
                take = min(seg.tokens - offset, self.block_tokens - filled)
                pieces.append(b"%d:%d:%d;" % (seg.content_id, offset, offset + take))
                offset += take
                filled += take
                if filled == self.block_tokens:
                    prev = hash_bytes(b"".join(pieces), prev)
                    out_l.append(prev)
                    pieces.clear()
                    filled = 0
            if len(self._states) < self._max_states:
                self._states[ids[index]] = (out_l, len(out_l), prev, tuple(pieces), filled)
        return tuple(out_l)
