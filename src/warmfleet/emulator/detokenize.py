"""vLLM's ``POST /detokenize`` for the emulator's tokenizer (``Detokenizer``; no I/O).

A piece's id is a hash of its text, so ids are turned back into text from what is known: the
special tokens, the output vocabulary (every word the emulator generates), and every piece the
instance's tokenizer has encoded and memoised (its bounded piece cache). Any other id below
``VOCAB_SIZE`` reads ``<|ID|>``; an id out of the vocabulary is a 400, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.protocol import check_model
from warmfleet.emulator.tokenizer import (
    OUTPUT_WORDS,
    SPECIAL_IDS,
    VOCAB_SIZE,
    EmulatorTokenizer,
    output_piece,
    output_token_id,
)


class Detokenizer:
    """Ids back to text for one instance's tokenizer (the reverse map is rebuilt when the
    tokenizer has memoised new pieces since)."""

    def __init__(self, tokenizer: EmulatorTokenizer) -> None:
        self._tokenizer = tokenizer
        fixed = {token_id: text for text, token_id in SPECIAL_IDS.items()}
        for seed in range(len(OUTPUT_WORDS)):  # every output word, first and later (spaced)
            for index in (0, 1):
                fixed[output_token_id(seed, index)] = output_piece(seed, index)
        self._fixed = fixed
        self._names: dict[int, str] = dict(fixed)
        self._known = 0

    def _refresh(self) -> None:
        pieces = self._tokenizer.known_pieces()
        if len(pieces) != self._known:
            self._names = {token_id: piece for piece, token_id in pieces}
            self._names.update(self._fixed)
            self._known = len(pieces)

    def decode(self, ids: list[int]) -> str:
        names = self._names
        if any(i not in names for i in ids):
            self._refresh()
            names = self._names
        return "".join([names.get(i) or f"<|{i}|>" for i in ids])

    def answer(self, body: object, model: str) -> dict[str, Any]:
        """The ``/detokenize`` answer to ``body`` (``{"model"?, "tokens"}``): ``{"prompt"}``."""
        if not isinstance(body, Mapping):
            raise BadRequestError("the request body must be a JSON object", param="body")
        check_model(body, model)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise BadRequestError("'tokens' must be an array of token ids", param="tokens")
        for t in tokens:
            if t >= VOCAB_SIZE:
                raise BadRequestError(f"Token id {t} is out of vocabulary", param="tokens")
        return {"prompt": self.decode(tokens)}
