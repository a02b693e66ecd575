"""A local Hugging Face tokenizer + chat template: the ``tokens`` key mode for real engines.

``HfChatTokenizer.from_dir(path)`` loads a model directory's ``tokenizer.json`` (with the
``tokenizers`` library, no ``transformers``) and its chat templates (``chat_template.jinja`` and
``additional_chat_templates/*.jinja``, or ``tokenizer_config.json``'s ``chat_template``: one, or
a list of named ones; a request with ``tools`` renders with ``tool_use`` when there is one, as
``transformers``' ``get_chat_template`` picks for vLLM), and renders chat requests the way vLLM's
OpenAI server does (``vllm/renderers/hf.py`` ``safe_apply_chat_template``, then ``transformers``'
``apply_chat_template``):

- messages are normalised like vLLM's "string" content format: text parts joined with ``"\\n"``,
  a missing content becomes ``""``; ``name``, ``tool_calls`` and ``tool_call_id`` pass through;
- the template runs in a sandboxed Jinja environment configured like ``transformers``
  (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``,
  ``strftime_now``) with ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the
  special tokens and the request's ``chat_template_kwargs`` as variables
  (``routing.chat_options.ChatTemplateOptions``). Like vLLM, only the entries that are undeclared
  variables of the template are kept (``resolve_chat_template_kwargs``); kept entries override
  the special tokens; an entry named ``messages``, ``conversation`` or ``self`` is a 400 (vLLM's
  call fails with "multiple values for keyword argument");
- ``continue_final_message``: the rendered text is cut right after the final message's content,
  as ``transformers`` cuts it (the content not found in the text is a 400);
- the rendered chat text is encoded *without* special tokens unless the request sets
  ``add_special_tokens`` (vLLM's chat default is false: the template already has them; a truthy
  ``chat_template_kwargs.tokenize`` makes the template's own encoding win, which adds none),
  while ``encode_prompt`` (completions) adds them unless the request sets
  ``add_special_tokens: false``, as vLLM's completions endpoint does.

Implements ``warmfleet.routing.keys.Tokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as RustTokenizer

from warmfleet.core.errors import BadRequestError, ConfigError
from warmfleet.edge import read_text_file
from warmfleet.routing.chat_options import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
# transformers' PreTrainedTokenizerBase.apply_chat_template parameters: vLLM keeps request kwargs
# of these names too, but they are consumed as arguments and never become template variables.
_HF_PARAMS = frozenset(
    {
        "self",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
# Texts at least this long are encoded without holding the GIL (HfChatTokenizer._ids).
_GIL_FREE_ENCODE_CHARS = 16_384
# Request kwargs that make vLLM's call fail ("got multiple values for keyword argument").
_COLLIDING = frozenset({"self", "conversation", "messages"})


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """A chat template compiled in an environment configured like ``transformers``'."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as err:
        raise ConfigError(f"chat_template: cannot compile: {err}") from err


def template_variables(source: str) -> frozenset[str]:
    """The variables a chat template reads from its context (``jinja2.meta``), found the way
    vLLM finds them: parsed in a fresh environment, so ``raise_exception`` and ``strftime_now``
    count (a request kwarg of that name shadows the function, as in ``transformers``)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))


def cut_after_final_message(rendered: str, final: str) -> str:
    """``continue_final_message``: ``rendered`` cut right after the last occurrence of the final
    message's content, as ``transformers``' ``render_jinja_template`` cuts it (after the content
    with its leading whitespace stripped, or stripped on both sides when the template trimmed
    its trailing whitespace)."""
    core = final.strip()
    # ``rfind`` is quadratic at worst on crafted texts (CPython searches backwards naively);
    # ``find`` over both reversed is linear (two-way search) and finds the same occurrence.
    found = rendered[::-1].find(core[::-1])
    at = -1 if found < 0 else len(rendered) - found - len(core)
    if at < 0:
        raise BadRequestError(
            "continue_final_message: the template drops the final message's content",
            param="messages",
        )
    lead_trimmed = final.lstrip()
    if rendered[at : at + len(lead_trimmed)] == final:
        return rendered[: at + len(lead_trimmed)]
    return rendered[: at + len(core)]


def _not_encodable(text: str) -> BadRequestError:
    """The 400 for a text ``tokenizers`` refused: a lone surrogate (JSON's ``\\ud800`` escapes
    allow one; it is not a Unicode character, and the engine's tokenizer cannot encode it
    either)."""
    at = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    if at is None:
        return BadRequestError("the prompt is not text the tokenizer can encode")
    return BadRequestError(
        f"the prompt holds a lone surrogate (U+{ord(text[at]):04X} at character {at}), "
        "which is not a Unicode character"
    )


def _token_text(value: object) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken-like dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_sources(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The model's chat templates by name, in ``transformers``' order: tokenizer_config.json's
    ``chat_template`` (one string, the default, or a list of ``{name, template}``), then
    ``chat_template.jinja`` (the default), then ``additional_chat_templates/<name>.jinja``.
    A default is required."""
    sources: dict[str, str] = {}
    template = config.get("chat_template")
    if isinstance(template, str):
        sources["default"] = template
    elif isinstance(template, list):
        for item in template:
            if isinstance(item, Mapping) and isinstance(item.get("template"), str):
                sources[str(item.get("name"))] = item["template"]
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        sources["default"] = read_text_file(jinja_file)
    for extra in sorted((directory / "additional_chat_templates").glob("*.jinja")):
        sources[extra.stem] = read_text_file(extra)
    if "default" not in sources:
        raise ConfigError(
            f"{directory}: no default chat template (chat_template.jinja or "
            "tokenizer_config.json chat_template)"
        )
    return sources


_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})  # vLLM reads these as text


def vllm_tool(tool: object) -> dict[str, Any]:
    """One request ``tools`` entry as vLLM hands it to the chat template (its pydantic
    ``ChatCompletionToolsParam.model_dump()``: declared fields in order, absent ones as None,
    the function's ``strict``/``defer_loading`` only when set, the function's unknown fields
    dropped, the tool's kept), so a template that prints the tools (``tool | tojson``) renders
    the same text as the engine's."""
    if not isinstance(tool, Mapping):
        raise BadRequestError("'tools' entries must be objects", param="tools")
    raw = tool.get("function")
    fn: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    function = {k: fn.get(k) for k in ("name", "description", "parameters")}
    if fn.get("strict") is not None:
        function["strict"] = fn["strict"]
    defer = tool.get("defer_loading")
    if (fn_defer := fn.get("defer_loading", defer)) is not None:
        function["defer_loading"] = fn_defer
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": function}
    out["defer_loading"] = defer
    out.update((k, v) for k, v in tool.items() if k not in out)
    return out


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message as vLLM hands it to a "string"-format chat template."""
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS:
                parts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping) and part.get("type") == "refusal":
                parts.append(str(part.get("refusal", "")))
        text = "\n".join(parts)
    else:
        raise BadRequestError("'content' must be a string, an array or null", param="messages")
    out: dict[str, Any] = {"role": message["role"], "content": text}
    for name in ("name", "tool_calls", "tool_call_id"):
        if message.get(name) is not None:
            out[name] = message[name]
    return out


@dataclass(frozen=True, slots=True)
class _NamedTemplate:
    compiled: jinja2.Template
    # The request kwargs vLLM keeps for it (resolve_chat_template_kwargs), but chat_template and
    # tokenize, which routing.chat_options resolves before the renderer sees them.
    accepted: frozenset[str]

    @classmethod
    def compile(cls, source: str) -> _NamedTemplate:
        compiled = compile_chat_template(source)  # first: a ConfigError for bad syntax
        accepted = (template_variables(source) | _HF_PARAMS) - {"chat_template", "tokenize"}
        return cls(compiled, accepted)


class HfChatTokenizer:
    """``encode_prompt``/``encode_chat`` over a local tokenizer.json + chat template."""

    def __init__(
        self,
        tokenizer: RustTokenizer,
        chat_template: str | Mapping[str, str],
        special_tokens: Mapping[str, str],
        source: str = "",
    ) -> None:
        """``chat_template``: the template, or the model's templates by name (``default``
        required; ``tool_use``, when present, renders the requests that carry ``tools``, as
        ``transformers``' ``get_chat_template`` picks it for vLLM)."""
        self._tokenizer = tokenizer
        sources = {"default": chat_template} if isinstance(chat_template, str) else chat_template
        if "default" not in sources:
            raise ConfigError("chat_template: no template named 'default'")
        self._templates = {name: _NamedTemplate.compile(src) for name, src in sources.items()}
        self.chat_template = sources["default"]
        self.special_tokens = dict(special_tokens)
        self.source = source

    @classmethod
    def from_dir(cls, path: str | Path) -> HfChatTokenizer:
        """Load ``path``/tokenizer.json and the chat template; ``ConfigError`` if unusable."""
        directory = Path(path)
        tokenizer_file = directory / "tokenizer.json"
        try:
            tokenizer = RustTokenizer.from_file(str(tokenizer_file))
        except Exception as err:  # the Rust library raises a plain Exception
            raise ConfigError(f"{tokenizer_file}: cannot load tokenizer: {err}") from err
        config_file = directory / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{config_file}: cannot read: {err}") from err
        if not isinstance(config, dict):
            raise ConfigError(f"{config_file}: not a JSON object")
        specials = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(config.get(name)))
        }
        return cls(tokenizer, _template_sources(directory, config), specials, str(directory))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> str:
        """The prompt text vLLM builds for ``messages``, the request's ``tools`` and its
        rendering ``options`` (``None``: the defaults)."""
        opts = options or DEFAULT_CHAT_OPTIONS
        conversation = [normalize_message(m) for m in messages]
        template = self._templates.get("tool_use") if tools is not None else None
        template = template or self._templates["default"]
        variables = self._variables(template, conversation, tools, opts)
        try:
            text = template.compiled.render(**variables)
        except BadRequestError:
            raise
        except Exception as err:  # vLLM answers any failure of the template with a 400, too
            raise BadRequestError(f"chat template failed: {err}", param="messages") from err
        if opts.continue_final_message and conversation:
            text = cut_after_final_message(text, conversation[-1]["content"])
        return text

    def _variables(
        self,
        template: _NamedTemplate,
        conversation: list[dict[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        opts: ChatTemplateOptions,
    ) -> dict[str, Any]:
        """The template's context, as ``transformers`` builds it from vLLM's arguments."""
        kept = {k: v for k, v in opts.template_kwargs.items() if k in template.accepted}
        clash = sorted(_COLLIDING & kept.keys())
        if clash:
            param = f"chat_template_kwargs.{clash[0]}"
            raise BadRequestError(f"'{param}' cannot be set: the renderer sets it", param=param)
        if "tools" in kept:  # vLLM: a chat_template_kwargs entry wins over the request's tools
            listed = kept["tools"]
        else:
            listed = None if tools is None else [vllm_tool(t) for t in tools]
        return {
            **self.special_tokens,
            **{k: v for k, v in kept.items() if k not in _HF_PARAMS},
            "messages": conversation,
            "tools": listed,
            "documents": opts.documents,
            "add_generation_prompt": opts.add_generation_prompt,
        }

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s ids. A long text goes through ``encode_batch_fast``: the same ids (no
        offsets), and it releases the GIL while it runs. ``encode`` holds it (~1 s for 1 MB with
        a byte-level tokenizer: the gateway's event loop stopped although the body worker ran
        it), and freeing its offsets took 70 ms more (the loop's longest wait now: ~10 ms)."""
        special = add_special_tokens
        try:
            if len(text) < _GIL_FREE_ENCODE_CHARS:
                return list(self._tokenizer.encode(text, add_special_tokens=special).ids)
            batch = self._tokenizer.encode_batch_fast([text], add_special_tokens=special)
        except TypeError as err:  # ``tokenizers`` takes Unicode text only (not a surrogate)
            raise _not_encodable(text) from err
        return list(batch[0].ids)

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Completions prompt ids: with the special tokens unless the request says otherwise,
        as vLLM's completions endpoint builds them."""
        return self._ids(text, add_special_tokens)

    def encode_raw(self, text: str) -> list[int]:
        """Ids of ``text`` without special tokens."""
        return self._ids(text, False)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> list[int]:
        """Chat prompt ids: the rendered template, encoded without adding special tokens unless
        the request's ``add_special_tokens`` asks for them (and no truthy ``tokenize`` kwarg
        had the template encode the text itself, which adds none)."""
        opts = options or DEFAULT_CHAT_OPTIONS
        text = self.render_chat(messages, tools=tools, options=opts)
        special = opts.add_special_tokens and not opts.template_kwargs.get("tokenize")
        return self._ids(text, special)
