"""The chat request fields, besides ``messages`` and ``tools``, that change vLLM's rendered prompt.

``tokens`` keys must be the token ids vLLM itself builds for a chat request, so
``chat_template_options(request.prompt_options)`` reads what vLLM's chat endpoint hands its chat
template (only the ``tokens`` key mode calls it, so only it rejects a malformed field), with
vLLM's precedence (``ChatCompletionRequest.build_chat_params`` and ``build_tok_params`` in
``vllm/entrypoints/openai/chat_completion/protocol.py``; ``merge_kwargs`` and ``ChatParams`` in
``vllm/renderers/params.py``; ``safe_apply_chat_template`` in ``vllm/renderers/hf.py``):

- ``add_generation_prompt`` (default true), ``continue_final_message`` (default false; both true
  is a 400 in vLLM too), ``documents`` (null or an array of objects of strings),
  ``reasoning_effort`` (null or a string; vLLM passes it to the template) and
  ``add_special_tokens`` (default false: special tokens added when encoding the rendered text);
- ``chat_template_kwargs`` (null or an object): its entries become template variables. The
  request's own fields win over entries of the same name unless the field is null
  (``merge_kwargs``): ``add_generation_prompt`` and ``continue_final_message`` always,
  ``documents`` and ``reasoning_effort`` when set. Then entries valued null or ``"auto"`` are
  dropped (``ChatParams.with_defaults``: "unset"). A ``tools`` entry replaces the request's
  ``tools`` as given (not vLLM's pydantic dump of them); a ``tokenize`` entry is kept for the
  tokenizer (truthy: the ids come from the template without special tokens added);
- a request-supplied template (``chat_template``, or a non-null ``chat_template_kwargs`` entry
  of that name) is refused, as vLLM refuses it unless started with
  ``--trust-request-chat-template``: the gateway only has the model's template, and keying with
  it a prompt the engine renders with another would be silently wrong.

Types are strict JSON types (vLLM's pydantic models would also coerce ``"true"`` or ``1``); every
malformed value is a ``BadRequestError`` naming the field, an explicit ``null`` for one of the
booleans too (vLLM declares them ``bool`` with a default, and null fails its validation). Which
of the remaining entries reach the template (vLLM keeps only the template's undeclared
variables) depends on the template, so the tokenizer decides (``warmfleet.gateway.tokenizer``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmfleet.routing.parse import CHAT_TEMPLATE_FIELDS, bad_request, bool_field

# The request fields that win over chat_template_kwargs entries of the same name (unless null),
# and are not template variables of their own: vLLM hands them to the template by name.
_FIXED = frozenset({"add_generation_prompt", "continue_final_message", "documents"})
_UNSET = (None, "auto")  # vllm/renderers/params.py merge_kwargs(unset_values=...)
# chat_template_kwargs entries a deployment's defaults may not set: the renderer's own arguments
# (vLLM's call fails on the first three) and a template (only the model's is known here).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "conversation", "self", "chat_template"})


@dataclass(frozen=True, slots=True)
class ChatTemplateOptions:
    """How vLLM renders and encodes one chat request, besides its messages and tools.

    ``template_kwargs`` are the merged ``chat_template_kwargs`` (request fields applied, unset
    entries dropped, ``add_generation_prompt``/``continue_final_message``/``documents`` taken
    out into their own fields); ``reasoning_effort`` is among them when set.
    """

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: Sequence[Mapping[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


DEFAULT_CHAT_OPTIONS = ChatTemplateOptions()


def _objects(value: object, param: str, *, strings: bool) -> list[Mapping[str, Any]]:
    """An array of objects (with only string values if ``strings``)."""
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise bad_request(f"'{param}' must be an array of objects", param)
    if strings and not all(isinstance(s, str) for doc in value for s in doc.values()):
        raise bad_request(f"'{param}' objects must have string values", param)
    return value


def _reject_request_template(body: Mapping[str, Any], kwargs: Mapping[str, Any]) -> None:
    for value, param in (
        (body.get("chat_template"), "chat_template"),
        (kwargs.get("chat_template"), "chat_template_kwargs.chat_template"),
    ):
        if value is not None:
            raise bad_request(
                "a request chat template is not supported in key mode 'tokens' (vLLM refuses "
                "it too unless started with --trust-request-chat-template); omit it",
                param,
            )


def _merged_kwargs(
    body: Mapping[str, Any], fixed: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """vLLM's ``merge_kwargs(defaults | chat_template_kwargs, fields)``, then unset entries
    dropped."""
    raw = body.get("chat_template_kwargs")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    _reject_request_template(body, raw)
    merged = {**defaults, **raw, **{k: v for k, v in fixed.items() if v not in _UNSET}}
    merged = {k: v for k, v in merged.items() if v not in _UNSET}
    tools = merged.get("tools")
    if tools is not None:
        _objects(tools, "chat_template_kwargs.tools", strings=False)
    return merged


def chat_template_options(
    body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> ChatTemplateOptions:
    """The rendering options of a chat's fields (``ChatRequest.prompt_options``, or the whole
    body), validated; the defaults if it sets none.
    ``defaults``: the engine's ``--default-chat-template-kwargs`` (vLLM merges the request's
    ``chat_template_kwargs`` over them)."""
    if not defaults and not any(name in body for name in CHAT_TEMPLATE_FIELDS):
        return DEFAULT_CHAT_OPTIONS
    generation = bool_field(body, "add_generation_prompt", True)
    continue_final = bool_field(body, "continue_final_message", False)
    if generation and continue_final:
        raise bad_request(
            "'continue_final_message' needs 'add_generation_prompt': false",
            "continue_final_message",
        )
    documents = body.get("documents")
    if documents is not None:
        _objects(documents, "documents", strings=True)
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise bad_request("'reasoning_effort' must be a string", "reasoning_effort")
    fixed = {
        "add_generation_prompt": generation,
        "continue_final_message": continue_final,
        "documents": documents,
        "reasoning_effort": effort,
    }
    merged = _merged_kwargs(body, fixed, defaults or {})
    documents = merged.get("documents")
    if documents is not None:  # from chat_template_kwargs (transformers checks the entries)
        documents = _objects(documents, "chat_template_kwargs.documents", strings=False)
    return ChatTemplateOptions(
        add_generation_prompt=generation,
        continue_final_message=continue_final,
        add_special_tokens=bool_field(body, "add_special_tokens", False),
        documents=documents,
        template_kwargs={k: v for k, v in merged.items() if k not in _FIXED},
    )
