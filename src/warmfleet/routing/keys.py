"""Routing keys: how a parsed request (``routing.request``) becomes a ``RoutingKey`` of salted
chained block hashes. This module holds the ``Tokenizer`` protocol and ``KeyHasher``, the hashing
every key mode shares (the settings, ``KeySpec``, are in ``routing.key_spec``);
``routing.key_modes`` holds one key builder per mode (see docs/routing.md):

- ``text``: the canonical text of a chat (``routing.canonical``: role, name, text parts, image
  URLs, tool calls with re-serialized JSON arguments, tools), independent of JSON whitespace
  and key order; counted in characters (each block of characters is hashed as its UTF-8 bytes).
- ``bytes``: AWS parity; the first bytes of the raw body (native invocations) or of the UTF-8
  canonical text (chat/completions bodies, which arrive parsed).
- ``tokens``: token ids from an injected ``Tokenizer`` (with the engine's chat template and the
  request's rendering options, ``chat_options``); the block size should equal the engine's.

Only hashes leave these modules; no raw text is kept.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import xxhash

from warmfleet.core.hashing import chain_blocks, chain_seed, hash_str
from warmfleet.core.types import RoutingKey
from warmfleet.routing.chains import SpanMemo
from warmfleet.routing.chat_options import ChatTemplateOptions
from warmfleet.routing.key_spec import CHARS_PER_TOKEN, DEFAULT_PREFIX_LENGTH, KeySpec
from warmfleet.routing.parse import bad_request
from warmfleet.routing.sessions import session_hash

_PREFIX_SALT = 0x5F5F
_SEED_CACHE_ENTRIES = 4096
# Seeds are memoised only for names this short in all (longer ones come from odd clients).
_SEED_MEMO_CHARS = 1024
_h64 = xxhash.xxh3_64_intdigest
_CACHE_SALT_TAG = "cache_salt:"


class Tokenizer(Protocol):
    """A local tokenizer with the engine's chat template (``gateway.tokenizer.HfChatTokenizer``).

    ``encode_prompt``: a completions prompt's ids, with the tokenizer's special tokens (BOS)
    unless the request's ``add_special_tokens`` is false, as vLLM's completions endpoint builds
    them. ``encode_chat``: a chat prompt's ids as the engine builds them for ``messages``, the
    request's ``tools`` and its rendering ``options`` (``None``: the defaults,
    ``chat_options.DEFAULT_CHAT_OPTIONS``).
    """

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> list[int]: ...


# --------------------------------------------------------------------------------------------
# Hashing


def estimated_tokens(text: str, mode: str) -> int:
    """``prompt_tokens`` of a text in ``text``/``bytes`` modes: characters / 4 (rounded up), or
    UTF-8 bytes / 4 (rounded down); at least 1 for a non-empty text."""
    if mode == "bytes":
        count = len(text.encode("utf-8", "surrogatepass")) // CHARS_PER_TOKEN
    else:
        count = (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    return max(count, 1 if text else 0)


class KeyHasher:
    """The hashing of one ``KeySpec``: chain seeds and ``RoutingKey``s of byte buffers, texts
    and token ids.

    Thread-safe (the gateway keys big bodies on a worker thread): its only state, two bounded
    memo dicts (seeds, ``SpanMemo``), holds pure functions of the keys, never mutated once
    stored, touched by single dict operations (atomic under the GIL).
    """

    def __init__(
        self, spec: KeySpec, *, prefix_length: int | None = None, hash_blocks: bool = True
    ) -> None:
        """``hash_blocks=False``: keys carry no ``block_hashes`` (for strategies that never
        read them); everything else in a key is the same."""
        self.spec = spec
        self.hash_blocks = hash_blocks
        self.block_size = spec.effective_block_size
        self.prefix_length = prefix_length or spec.prefix_length or DEFAULT_PREFIX_LENGTH
        self.max_blocks = min(spec.max_units // self.block_size, spec.max_blocks)
        # the characters of an ASCII text that its blocks and prefix hash read (``from_chars``)
        self._read_chars = max(self.max_blocks * self.block_size, self.prefix_length)
        self._seeds: dict[tuple[str, str | None, str | None], int] = {}
        self.spans = SpanMemo()

    def seed(
        self,
        model: str,
        lora_adapter: str | None,
        tenant: str | None,
        cache_salt: str | None = None,
    ) -> int:
        """Start of the chain for (model, adapter, tenant[, vLLM cache_salt]), memoised in a
        bounded map. Without a cache salt the seed is the unsalted one (KV-event translation
        starts its chains there); with one, the salt is chained onto it per request (a client's
        salt, of any length, is never kept)."""
        cache = self._seeds
        memo = (model, lora_adapter, tenant)
        seed = cache.get(memo)
        if seed is None:
            seed = chain_seed(self.spec.salt, model, lora_adapter, tenant)
            if len(model) + len(lora_adapter or "") + len(tenant or "") <= _SEED_MEMO_CHARS:
                if len(cache) >= _SEED_CACHE_ENTRIES:
                    cache.clear()
                cache[memo] = seed
        if cache_salt is not None:  # = chain_seed(salt, model, adapter, tenant, tag + salt)
            seed = hash_str(_CACHE_SALT_TAG + cache_salt, seed)
        return seed

    def from_chars(self, text: str, seed: int, hint: int) -> RoutingKey:
        """A text counted in characters (``text`` mode): each block of characters is hashed as
        its UTF-8 bytes."""
        n = len(text)
        tokens = (n + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN  # estimated_tokens, inline
        if text.isascii():  # (O(1)) character blocks are byte blocks
            # only what the blocks and the prefix hash read is encoded (a 7.5 MB text: ~5 ms)
            cut = self._read_chars
            data = (text[:cut] if n > cut else text).encode("ascii")
            return self.from_buffer(
                data, unit_bytes=1, seed=seed, hint=hint, prompt_tokens=tokens, units=n
            )
        # Each block of characters is hashed as its UTF-8 bytes, exactly like the ASCII path.
        size = self.block_size
        end = min(len(text) - len(text) % size, self.max_blocks * size) if self.hash_blocks else 0
        blocks = [text[i : i + size].encode("utf-8", "surrogatepass") for i in range(0, end, size)]
        prefix = text[: self.prefix_length].encode("utf-8", "surrogatepass")
        return RoutingKey(
            block_hashes=chain_blocks(blocks, seed),
            block_size=size,
            units=len(text),
            prompt_tokens=tokens,
            prefix_hash=_h64(prefix, seed ^ _PREFIX_SALT),
            output_tokens_hint=hint,
            chain_seed=seed,
        )

    def from_utf8(self, text: str, seed: int, hint: int) -> RoutingKey:
        """A text counted in UTF-8 bytes (``bytes`` mode)."""
        data = text.encode("utf-8", "surrogatepass")
        return self.from_buffer(
            data, unit_bytes=1, seed=seed, hint=hint, prompt_tokens=len(data) // CHARS_PER_TOKEN
        )

    def from_token_ids(self, ids: Sequence[int], seed: int, hint: int, block: int) -> RoutingKey:
        try:
            data = array("Q", ids).tobytes()
        except (OverflowError, TypeError) as err:
            raise bad_request("token ids must be integers in [0, 2**64)", "prompt") from err
        return self.from_buffer(
            data, unit_bytes=8, seed=seed, hint=hint, prompt_tokens=len(ids), block=block
        )

    def from_buffer(
        self,
        data: bytes,
        *,
        unit_bytes: int,
        seed: int,
        hint: int,
        prompt_tokens: int,
        block: int | None = None,
        units: int | None = None,
    ) -> RoutingKey:
        """``units``: the text's length when ``data`` holds only its beginning (at least what
        the blocks and the prefix hash read); by default ``data``'s."""
        block_units = block or self.block_size
        if units is None:
            units = len(data) // unit_bytes
        max_blocks = min(self.spec.max_units // block_units, self.spec.max_blocks)
        step = unit_bytes * block_units
        n_blocks = min(len(data) // step, max_blocks)
        hashes = self.spans.chain(data, step, n_blocks, seed) if self.hash_blocks else ()
        prefix_hash = _h64(data[: self.prefix_length * unit_bytes], seed ^ _PREFIX_SALT)
        return RoutingKey(
            block_hashes=hashes,
            block_size=block_units,
            units=units,
            prompt_tokens=max(prompt_tokens, 1 if units else 0),
            prefix_hash=prefix_hash,
            output_tokens_hint=hint,
            chain_seed=seed,
        )


def with_session(key: RoutingKey, session: str | None) -> RoutingKey:
    """``key`` with the session ``session`` (hashed under the key's chain seed); ``key`` itself
    without one."""
    if session is None:
        return key
    return RoutingKey(
        key.block_hashes,
        key.block_size,
        key.units,
        key.prompt_tokens,
        key.prefix_hash,
        key.output_tokens_hint,
        key.chain_seed,
        session_hash(session, key.chain_seed or 0),
    )


def key_from_blocks(
    block_hashes: Sequence[int],
    *,
    block_size: int,
    units: int,
    prompt_tokens: int,
    prefix_length: int,
    seed: int,
    output_tokens_hint: int = 0,
    session: str | None = None,
) -> RoutingKey:
    """A ``RoutingKey`` for callers that already have chained block hashes (the simulator).

    ``prefix_hash`` is the chained hash of the last full block inside ``prefix_length`` units
    (it identifies the whole prefix); for prompts shorter than one block, the seed mixed with
    ``units``. ``session``: the request's session id, hashed as the gateway hashes it.
    """
    hashes = tuple(block_hashes)
    n_prefix = min(len(hashes), prefix_length // block_size)
    if n_prefix > 0:
        prefix_hash = hashes[n_prefix - 1]
    else:
        prefix_hash = _h64(units.to_bytes(8, "little"), seed ^ _PREFIX_SALT)
    return RoutingKey(
        hashes,
        block_size,
        units,
        prompt_tokens,
        prefix_hash,
        output_tokens_hint,
        chain_seed=seed,
        session=None if session is None else session_hash(session, seed),
    )
