"""One key builder per key mode: ``TextKeys``, ``BytesKeys`` and ``TokenKeys`` turn a parsed
request (``routing.request``) into its ``RoutingKey``; ``key_builder(spec, tokenizer)`` builds the
one ``KeySpec.mode`` names.

A chat is rendered only by the modes that hash its text (``routing.canonical``); ``tokens``
hands its messages to the tokenizer. A batch of completions prompts is keyed on its first prompt
(a key is one chain, and the engine chains each prompt of a batch from the start, so the first
stands for the batch), but ``prompt_tokens`` counts every prompt (the load the batch puts on its
instance). Token-id prompts are hashed as ids in every mode: in ``text``/``bytes`` modes a block
holds ``block_size / CHARS_PER_TOKEN`` ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace

from warmfleet.core.errors import ConfigError
from warmfleet.core.types import RoutingKey
from warmfleet.routing.canonical import render_chat_text
from warmfleet.routing.chat_options import chat_template_options
from warmfleet.routing.key_spec import CHARS_PER_TOKEN, KeySpec
from warmfleet.routing.keys import (
    KeyHasher,
    Tokenizer,
    estimated_tokens,
    with_session,
)
from warmfleet.routing.parse import bool_field
from warmfleet.routing.request import ChatRequest, CompletionsRequest, KeyRequest, NativeRequest


class KeyBuilder(KeyHasher, ABC):
    """The keys of one ``KeySpec``: ``key(request)`` for any parsed request. Thread-safe like
    ``KeyHasher``; so must the tokenizer be. ``tokenizer``: the one the router was built with
    (only ``tokens`` keys use it; ``Router.adopt`` compares it)."""

    def __init__(
        self,
        spec: KeySpec,
        tokenizer: Tokenizer | None = None,
        *,
        prefix_length: int | None = None,
        hash_blocks: bool = True,
    ) -> None:
        super().__init__(spec, prefix_length=prefix_length, hash_blocks=hash_blocks)
        self.tokenizer = tokenizer

    def key(self, request: KeyRequest) -> RoutingKey:
        """The key of ``request``, carrying its session (``RoutingKey.session``) if it has one."""
        if isinstance(request, ChatRequest):
            key = self.chat(request)
        elif isinstance(request, CompletionsRequest):
            key = self.completions(request)
        else:
            key = self.native(request)
        return key if request.session is None else with_session(key, request.session)

    def request_seed(self, request: ChatRequest | CompletionsRequest) -> int:
        return self.seed(request.model, None, request.tenant, request.cache_salt)

    @abstractmethod
    def chat(self, request: ChatRequest) -> RoutingKey: ...

    @abstractmethod
    def completions(self, request: CompletionsRequest) -> RoutingKey:
        """Keyed on the first prompt of a batch; ``prompt_tokens`` counts every prompt."""

    @abstractmethod
    def native(self, request: NativeRequest) -> RoutingKey: ...


class RenderedTextKeys(KeyBuilder):
    """The modes that hash text: a chat's canonical text, a native body decoded as UTF-8; a
    token-id prompt's ids in blocks of ``block_size / CHARS_PER_TOKEN``."""

    @abstractmethod
    def text_key(self, text: str, seed: int, hint: int) -> RoutingKey: ...

    def chat(self, request: ChatRequest) -> RoutingKey:
        seed = self.seed(request.model, None, request.tenant, request.cache_salt)
        return self.text_key(render_chat_text(request), seed, request.output_tokens_hint)

    def native(self, request: NativeRequest) -> RoutingKey:
        seed = self.seed(request.model, None, request.tenant)
        return self.text_key(bytes(request.raw).decode("utf-8", "replace"), seed, 0)

    def completions(self, request: CompletionsRequest) -> RoutingKey:
        seed = self.request_seed(request)
        prompts = request.prompts
        first, hint = prompts[0], request.output_tokens_hint
        if isinstance(first, str):
            key = self.text_key(first, seed, hint)
        else:
            key = self.from_token_ids(first, seed, hint, max(1, self.block_size // CHARS_PER_TOKEN))
        if len(prompts) == 1:
            return key
        mode = self.spec.mode
        rest = sum(estimated_tokens(p, mode) if isinstance(p, str) else len(p) for p in prompts[1:])
        return replace(key, prompt_tokens=key.prompt_tokens + rest)


class TextKeys(RenderedTextKeys):
    """``text``: texts counted (and blocked) in characters."""

    def text_key(self, text: str, seed: int, hint: int) -> RoutingKey:
        return self.from_chars(text, seed, hint)


class BytesKeys(RenderedTextKeys):
    """``bytes``: texts as UTF-8 bytes; a native invocation's raw body as it is (AWS parity)."""

    def text_key(self, text: str, seed: int, hint: int) -> RoutingKey:
        return self.from_utf8(text, seed, hint)

    def native(self, request: NativeRequest) -> RoutingKey:
        raw = bytes(request.raw)
        seed = self.seed(request.model, None, request.tenant)
        tokens = len(raw) // CHARS_PER_TOKEN
        return self.from_buffer(raw, unit_bytes=1, seed=seed, hint=0, prompt_tokens=tokens)


class TokenKeys(KeyBuilder):
    """``tokens``: token ids from the tokenizer, with the request's rendering options."""

    def __init__(
        self,
        spec: KeySpec,
        tokenizer: Tokenizer,
        *,
        prefix_length: int | None = None,
        hash_blocks: bool = True,
    ) -> None:
        super().__init__(spec, tokenizer, prefix_length=prefix_length, hash_blocks=hash_blocks)
        self.encoder = tokenizer  # self.tokenizer, never None here

    def chat(self, request: ChatRequest) -> RoutingKey:
        seed = self.request_seed(request)
        fields = request.prompt_options
        tools = request.tools
        if self.spec.exclude_tools_when_tool_choice_none and fields.get("tool_choice") == "none":
            tools = None
        options = chat_template_options(fields, self.spec.default_chat_template_kwargs)
        ids = self.encoder.encode_chat(request.messages, tools=tools, options=options)
        return self.from_token_ids(ids, seed, request.output_tokens_hint, self.block_size)

    def native(self, request: NativeRequest) -> RoutingKey:
        seed = self.seed(request.model, None, request.tenant)
        text = bytes(request.raw).decode("utf-8", "replace")
        return self.from_token_ids(self.encoder.encode_prompt(text), seed, 0, self.block_size)

    def completions(self, request: CompletionsRequest) -> RoutingKey:
        # vLLM's completions ``add_special_tokens`` (default true: the tokenizer's BOS is added
        # to a text prompt; clients that send an already templated prompt set it false).
        special = bool_field(request.prompt_options, "add_special_tokens", True)
        prompts = request.prompts
        seed = self.request_seed(request)
        ids = self._ids(prompts[0], special)
        key = self.from_token_ids(ids, seed, request.output_tokens_hint, self.block_size)
        if len(prompts) == 1:
            return key
        rest = sum(len(self._ids(p, special)) for p in prompts[1:])
        return replace(key, prompt_tokens=key.prompt_tokens + rest)

    def _ids(self, prompt: str | Sequence[int], special: bool) -> Sequence[int]:
        if isinstance(prompt, str):
            return self.encoder.encode_prompt(prompt, special)
        return prompt


def key_builder(
    spec: KeySpec,
    tokenizer: Tokenizer | None = None,
    *,
    prefix_length: int | None = None,
    hash_blocks: bool = True,
) -> KeyBuilder:
    """The key builder of ``spec.mode`` (``prefix_length``: the strategy's, if it has one;
    ``hash_blocks``: whether the strategy reads block hashes)."""
    if spec.mode == "tokens":
        if tokenizer is None:
            raise ConfigError("key.mode: 'tokens' needs a tokenizer (none was configured)")
        return TokenKeys(spec, tokenizer, prefix_length=prefix_length, hash_blocks=hash_blocks)
    builder = BytesKeys if spec.mode == "bytes" else TextKeys
    return builder(spec, tokenizer, prefix_length=prefix_length, hash_blocks=hash_blocks)
