"""A local Hugging Face tokenizer + chat template: the ``tokens`` key mode for real engines.

``HfChatTokenizer.from_dir(path)`` loads a model directory's ``tokenizer.json`` (with the
``tokenizers`` library, no ``transformers``) and its chat template (``tokenizer_config.json``'s
``chat_template``, or ``chat_template.jinja``), and renders chat requests the way vLLM's OpenAI
server does:

- messages are normalised like vLLM's "string" content format: text parts joined with ``"\\n"``,
  a missing content becomes ``""``; ``name``, ``tool_calls`` and ``tool_call_id`` pass through;
- the template runs in a sandboxed Jinja environment configured like ``transformers``
  (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``,
  ``strftime_now``) with the special tokens as variables and ``add_generation_prompt=True``;
- the rendered chat text is encoded *without* special tokens (the template already has them;
  vLLM's chat endpoint defaults ``add_special_tokens`` to false), while ``encode`` (completions)
  adds them, as vLLM's completions endpoint does.

Implements ``warmfleet.routing.keys.Tokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as RustTokenizer

from warmfleet.core.errors import BadRequestError, ConfigError

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


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


def _token_text(value: object) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken-like dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_source(directory: Path, config: Mapping[str, Any]) -> str:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # [{name, template}, ...]: the "default" one
        for item in template:
            if isinstance(item, Mapping) and item.get("name") == "default":
                return str(item["template"])
    raise ConfigError(f"{directory}: no chat template (tokenizer_config.json chat_template)")


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


class HfChatTokenizer:
    """``encode``/``encode_chat`` over a local tokenizer.json + chat template."""

    def __init__(
        self,
        tokenizer: RustTokenizer,
        chat_template: str,
        special_tokens: Mapping[str, str],
        source: str = "",
    ) -> None:
        self._tokenizer = tokenizer
        self._template = compile_chat_template(chat_template)
        self.chat_template = chat_template
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
        return cls(tokenizer, _template_source(directory, config), specials, str(directory))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text vLLM builds for ``messages`` (and the request's ``tools``)."""
        try:
            return self._template.render(
                messages=[normalize_message(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None if tools is None else [vllm_tool(t) for t in tools],
                documents=None,
                **self.special_tokens,
            )
        except jinja2.TemplateError as err:
            raise BadRequestError(f"chat template failed: {err}", param="messages") from err

    def encode(self, text: str) -> list[int]:
        """Completions prompt ids (special tokens added, as vLLM's completions endpoint does)."""
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def encode_raw(self, text: str) -> list[int]:
        """Ids of ``text`` without special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Chat prompt ids: the rendered template, encoded without adding special tokens."""
        return self.encode_raw(self.render_chat(messages, tools=tools))
