"""Deterministic embeddings for the emulator's ``POST /v1/embeddings`` (no I/O).

An input (a string, tokenized as a completions prompt, or token ids; or a batch of either) is
embedded from the hash of its token ids: ``dimensions`` (default ``DEFAULT_DIMENSIONS``) values
in [-1, 1), each the xxh3 hash of the packed ids under its own seed, scaled to unit length. The
same input always gives the same vector, and different inputs unrelated ones. The vectors come
as JSON floats or, with ``encoding_format: "base64"`` (what the official client asks for unless
told otherwise), as the base64 of little-endian float32 values. The answer is computed at once:
embeddings are not scheduled on the emulated engine.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.protocol import ParseContext, check_model
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.routing.parse import completions_prompts

DEFAULT_DIMENSIONS = 64
MAX_DIMENSIONS = 4096
_SCALE = 2.0 / (1 << 64)


def embedding(token_ids: list[int], dimensions: int) -> list[float]:
    """The unit vector of ``token_ids`` (module docstring)."""
    data = array("Q", token_ids).tobytes()
    values = [xxhash.xxh3_64_intdigest(data, seed=i) * _SCALE - 1.0 for i in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _dimensions(body: Mapping[str, Any]) -> int:
    value = body.get("dimensions")
    if value is None:
        return DEFAULT_DIMENSIONS
    if type(value) is not int or not 1 <= value <= MAX_DIMENSIONS:
        raise BadRequestError(
            f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}", param="dimensions"
        )
    return value


def _encoding(body: Mapping[str, Any]) -> str:
    value = body.get("encoding_format")
    if value is None:
        return "float"
    if value not in ("float", "base64"):
        raise BadRequestError(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    return str(value)


def _ids(
    prompt: str | Sequence[int], body: Mapping[str, Any], tokenizer: EmulatorTokenizer
) -> list[int]:
    if not isinstance(prompt, str):
        return list(prompt)
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise BadRequestError("'add_special_tokens' must be a boolean", param="add_special_tokens")
    return tokenizer.encode_prompt(prompt, add_special)


def embeddings_answer(body: object, ctx: ParseContext) -> dict[str, Any]:
    """The answer to an embeddings body; ``BadRequestError``/``NotFoundError`` otherwise."""
    if not isinstance(body, Mapping):
        raise BadRequestError("the request body must be a JSON object", param="body")
    model = check_model(body, ctx.model)
    prompts: Sequence[str | Sequence[int]] = completions_prompts(body.get("input"), "input")
    dimensions = _dimensions(body)
    encoding = _encoding(body)
    data: list[dict[str, Any]] = []
    tokens = 0
    for index, prompt in enumerate(prompts):
        ids = _ids(prompt, body, ctx.tokenizer)
        if not ids:
            raise BadRequestError("'input' must not be empty", param="input")
        if len(ids) > ctx.spec.max_model_len:
            raise BadRequestError(
                f"This model's maximum context length is {ctx.spec.max_model_len} tokens; "
                f"input {index} has {len(ids)}",
                param="input",
            )
        tokens += len(ids)
        vector: Any = embedding(ids, dimensions)
        if encoding == "base64":
            packed = array("f", vector)
            if sys.byteorder == "big":
                packed.byteswap()
            vector = base64.b64encode(packed.tobytes()).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "model": model, "data": data, "usage": usage}
