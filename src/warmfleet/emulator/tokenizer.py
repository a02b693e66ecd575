"""The emulator's deterministic tokenizer, chat template and output text (pure, no I/O).

Tokenization (documented in docs/emulator.md, relied on by load generators):

- The special tokens of the chat template below are single tokens (ids 1-6).
- Other text is cut into pieces by ``\\s*\\S{1,4}|\\s+``: optional leading whitespace plus up to
  four non-space characters, or a run of trailing whitespace. So a space-separated word of one to
  four characters is exactly one token, and longer words cost one token per four characters
  (about what a BPE tokenizer gives for English).
- A piece's id is a 64-bit xxh3 hash of its UTF-8 bytes folded into ``[64, VOCAB_SIZE)``.

The chat template mimics Llama 3's, with no text between the special tokens, so the rendering of
a conversation is a token prefix of the rendering of any continuation of it (multi-turn chats
share token blocks, as with a real template)::

    <|begin_of_text|>
    <|start_header_id|>ROLE<|end_header_id|>CONTENT<|eot_id|>   (per message)
    <|start_header_id|>assistant<|end_header_id|>                  (generation prompt)
"""

from __future__ import annotations

import itertools
import json
import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from warmfleet.core.errors import BadRequestError
from warmfleet.core.hashing import hash_str
from warmfleet.routing.chains import chain_buffer
from warmfleet.routing.chat_options import ChatTemplateOptions

VOCAB_SIZE = 128_000
FIRST_PLAIN_ID = 64
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
IMAGE = "<|image|>"
SPECIAL_IDS: dict[str, int] = {BOS: 1, EOS: 2, START_HEADER: 3, END_HEADER: 4, EOT: 5, IMAGE: 6}
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_IDS) + ")")
_PIECE = re.compile(r"\s*\S{1,4}|\s+")
_PLAIN_RANGE = VOCAB_SIZE - FIRST_PLAIN_ID
_PIECE_CACHE_LIMIT = 200_000
_SEGMENT_MIN_CHARS = 256  # segments at least this long are memoised whole
_SEGMENT_CACHE_CHARS = 32 * 1024 * 1024
_PREFIX_STEP_CHARS = 256  # long texts' prefixes are memoised at every multiple of this
_PREFIX_CACHE_LIMIT = 16_384  # prefix states (256 characters and ~64 ids each): ~16 MiB

# Output vocabulary: words of at most four letters, so every output word is exactly one token.
OUTPUT_WORDS: tuple[str, ...] = (
    "the", "warm", "fast", "keep", "kv", "hit", "miss", "load", "node", "gpu", "fit", "hot",
    "cold", "page", "tile", "fold", "map", "key", "salt", "hash", "tree", "leaf", "root", "path",
    "time", "step", "rate", "pool", "lane", "flow", "wave", "zone", "mesh", "grid", "core", "bus",
    "byte", "word", "line", "edge", "hop", "link", "port", "gate", "road", "ring", "set", "sum",
    "mean", "tail", "head", "spin", "run", "go", "yes", "ok", "and", "or", "to", "in", "on", "at",
    "up", "via",
)  # fmt: skip


def _hash_piece(piece: str) -> int:
    return FIRST_PLAIN_ID + xxhash.xxh3_64_intdigest(piece.encode("utf-8", "replace")) % (
        _PLAIN_RANGE
    )


class _PieceIds(dict[str, int]):
    """piece -> id; a miss computes the id (``dict.__getitem__`` stays in C on hits)."""

    __slots__ = ()

    def __missing__(self, piece: str) -> int:
        value = _hash_piece(piece)
        if len(self) < _PIECE_CACHE_LIMIT:
            self[piece] = value
        return value


@dataclass(frozen=True, slots=True)
class _PrefixState:
    """Tokenization of a text prefix ``text[:boundary]``: the ids of every piece that ends
    before ``resume`` (those pieces are final whatever follows), and the prefix's serial."""

    serial: int
    ids: tuple[int, ...]  # ids of the pieces between the parent's ``resume`` and this one's
    resume: int


class EmulatorTokenizer:
    """Deterministic text -> token ids (implements ``routing.keys.Tokenizer``).

    Piece ids, the ids of long text segments (system prompts and documents repeat across
    requests) and the tokenization of long texts' prefixes, cut every ``prefix_step_chars``
    characters (prompts that share a long text prefix, then differ), are memoised in bounded
    per-instance caches; results never depend on the caches (see ``_encode_long``).
    """

    def __init__(self, prefix_step_chars: int = _PREFIX_STEP_CHARS) -> None:
        if prefix_step_chars < 1:
            raise ValueError("prefix_step_chars must be >= 1")
        self._ids = _PieceIds()
        self._segments: dict[str, tuple[int, ...]] = {}
        self._segment_chars = 0
        self._step = prefix_step_chars
        self._prefixes: dict[tuple[int, str], _PrefixState] = {}
        self._serials = itertools.count(1)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special-token recognition."""
        if len(text) < _SEGMENT_MIN_CHARS:
            return list(map(self._ids.__getitem__, _PIECE.findall(text)))
        cached = self._segments.get(text)
        if cached is not None:
            return list(cached)
        ids = self._encode_long(text)
        self._remember(text, tuple(ids))
        return ids

    def _encode_long(self, text: str) -> list[int]:
        """``encode_plain`` of a long text, resuming from the longest memoised prefix.

        A piece of ``findall(text[:b])`` that ends before ``b`` is also a piece of
        ``findall(text)``: the pattern decides where a piece ends from its own characters and
        the one after it, and pieces are contiguous (every character belongs to one). Only the
        last piece of a prefix can grow, so a prefix state keeps the ids of the pieces before
        it and tokenizing resumes at its start. States are keyed by (parent serial, chunk
        text): a lookup can only follow a path of exactly this text's chunks.
        """
        step = self._step
        prefixes = self._prefixes
        getitem = self._ids.__getitem__
        out: list[int] = []
        parent = 0
        resume = 0
        boundary = step
        end = len(text)
        while boundary < end:
            key = (parent, text[boundary - step : boundary])
            state = prefixes.get(key)
            if state is None:
                pieces = _PIECE.findall(text, resume, boundary)
                ids = tuple(map(getitem, pieces[:-1]))
                state = _PrefixState(next(self._serials), ids, boundary - len(pieces[-1]))
                self._store_prefix(key, state)
            out.extend(state.ids)
            parent = state.serial
            resume = state.resume
            boundary += step
        out.extend(map(getitem, _PIECE.findall(text, resume)))
        return out

    def _store_prefix(self, key: tuple[int, str], state: _PrefixState) -> None:
        prefixes = self._prefixes
        if len(prefixes) >= _PREFIX_CACHE_LIMIT:
            prefixes.clear()  # cheaper than LRU bookkeeping on every hit; refills in one request
        prefixes[key] = state

    def _remember(self, text: str, ids: tuple[int, ...]) -> None:
        segments = self._segments
        while segments and self._segment_chars + len(text) > _SEGMENT_CACHE_CHARS:
            oldest = next(iter(segments))
            del segments[oldest]
            self._segment_chars -= len(oldest)
        if len(text) <= _SEGMENT_CACHE_CHARS:
            segments[text] = ids
            self._segment_chars += len(text)

    def known_pieces(self) -> list[tuple[str, int]]:
        """The (piece, id) pairs memoised so far: a snapshot of the bounded piece cache."""
        return list(self._ids.items())

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; the template's special tokens are recognised as single tokens."""
        if "<|" not in text:  # every special token starts with it
            return self.encode_plain(text)
        out: list[int] = []
        for i, part in enumerate(_SPECIAL_SPLIT.split(text)):
            if i % 2:
                out.append(SPECIAL_IDS[part])
            elif part:
                out.extend(self.encode_plain(part))
        return out

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A completions prompt: BOS then the text (vLLM adds BOS by default)."""
        ids = [SPECIAL_IDS[BOS]] if add_special_tokens else []
        ids.extend(self.encode(text))
        return ids

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> list[int]:
        """``encode(render_chat(...))``, encoding the template's parts one by one.

        Equal to encoding the rendered text: every special token has ``<`` only as its first
        character and none is a prefix of another, so no special token can straddle the border
        between a template token and the text around it. ``options`` (the gateway's, as a
        ``routing.keys.Tokenizer``): only ``add_generation_prompt`` applies, the one rendering
        option the emulator's server reads.
        """
        if options is not None:
            add_generation_prompt = options.add_generation_prompt
        out: list[int] = []
        for part in chat_parts(messages, add_generation_prompt, tools):
            special = SPECIAL_IDS.get(part)
            if special is not None:
                out.append(special)
            elif part:
                out.extend(self.encode(part))
        return out


# --------------------------------------------------------------------------------------------
# Chat template


def _bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def _json_text(value: object, param: str) -> str:
    """Compact, key-sorted JSON of a request value rendered into the prompt; a value nested
    too deeply to serialise (the body parser accepts 1,024 levels) is the client's error."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except RecursionError as err:
        raise _bad(f"'{param}' is nested too deeply", param) from err


def _content_text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{param}' must be a string, an array of content parts or null", param)
    pieces: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise _bad(f"'{param}[{i}]' must be an object", f"{param}[{i}]")
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif part.get("type") == "image_url":
            pieces.append(IMAGE)
        else:
            pieces.append(_json_text(part, f"{param}[{i}]"))
    return "".join(pieces)


def chat_parts(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Any] | None = None,
) -> list[str]:
    """The template text in parts (special tokens as parts of their own); validates."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array", "messages")
    out = [BOS]
    if tools:
        tools_json = _json_text(tools, "tools")
        out += (START_HEADER, "tools", END_HEADER, tools_json, EOT)
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise _bad(f"'{param}' must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"'{param}.role' must be a non-empty string", f"{param}.role")
        text = _content_text(message.get("content"), f"{param}.content")
        calls = message.get("tool_calls")
        if calls:
            text += _json_text(calls, f"{param}.tool_calls")
        out += (START_HEADER, role, END_HEADER, text, EOT)
    if add_generation_prompt:
        out += (START_HEADER, "assistant", END_HEADER)
    return out


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Any] | None = None,
) -> str:
    """The conversation as template text (special tokens included); validates the messages."""
    return "".join(chat_parts(messages, add_generation_prompt, tools))


# --------------------------------------------------------------------------------------------
# Block hashes and output text


def prompt_block_hashes(
    token_ids: Sequence[int], block_size: int, seed: int, max_blocks: int = 1 << 20
) -> tuple[int, ...]:
    """Chained hashes of the full ``block_size``-token blocks (``routing.keys`` tokens scheme)."""
    try:
        data = array("Q", token_ids).tobytes()
    except (OverflowError, TypeError) as err:
        raise _bad("token ids must be integers in [0, 2**64)", "prompt") from err
    return prompt_block_hashes_bytes(data, block_size, seed, max_blocks)


def prompt_block_hashes_bytes(
    data: bytes, block_size: int, seed: int, max_blocks: int = 1 << 20
) -> tuple[int, ...]:
    """``prompt_block_hashes`` of token ids already packed as uint64 (``array("Q")``)."""
    return chain_buffer(data, 8, block_size, max_blocks, seed)


def hash_seed(base_seed: int, cache_salt: str | None) -> int:
    """The start of a prompt's hash chain; vLLM's ``cache_salt`` isolates a tenant's blocks."""
    return base_seed if cache_salt is None else hash_str(cache_salt, base_seed)


_WORD_STRIDE = 0x9E3779B1
_LATER_WORDS = tuple(" " + w for w in OUTPUT_WORDS)
_FIRST_JSON = tuple(json.dumps(w).encode() for w in OUTPUT_WORDS)
_LATER_JSON = tuple(json.dumps(" " + w).encode() for w in OUTPUT_WORDS)


def _word_index(text_seed: int, index: int) -> int:
    return (text_seed + index * _WORD_STRIDE) % len(OUTPUT_WORDS)


def output_piece(text_seed: int, index: int) -> str:
    """The text of output token ``index``: a word, with a leading space after the first."""
    table = OUTPUT_WORDS if index == 0 else _LATER_WORDS
    return table[_word_index(text_seed, index)]


def output_token_id(text_seed: int, index: int) -> int:
    """The token id of output token ``index`` (its text re-tokenizes to exactly this id)."""
    return _hash_piece(output_piece(text_seed, index))


def output_piece_json(text_seed: int, index: int) -> bytes:
    """``output_piece`` as a JSON string literal (pre-encoded: the streaming hot path)."""
    table = _FIRST_JSON if index == 0 else _LATER_JSON
    return table[_word_index(text_seed, index)]


def output_pieces_json(text_seed: int, first_index: int, last_index: int) -> list[bytes]:
    """``output_piece_json`` of tokens ``first_index`` .. ``last_index - 1``."""
    n = len(OUTPUT_WORDS)
    seed = text_seed % n
    stride = _WORD_STRIDE % n
    later = _LATER_JSON
    out = [later[(seed + i * stride) % n] for i in range(max(first_index, 1), last_index)]
    if first_index == 0 < last_index:
        out.insert(0, _FIRST_JSON[seed])
    return out


def output_text(text_seed: int, tokens: int) -> str:
    """The whole output of ``tokens`` tokens (``output_piece`` 0 .. tokens - 1, joined)."""
    if tokens <= 0:
        return ""
    n = len(OUTPUT_WORDS)
    later = _LATER_WORDS
    seed = text_seed % n
    stride = _WORD_STRIDE % n
    head = OUTPUT_WORDS[seed]
    return head + "".join([later[(seed + i * stride) % n] for i in range(1, tokens)])
