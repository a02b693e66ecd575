"""A model with several named chat templates (``tool_use`` beside ``default``): requests with
``tools`` render with ``tool_use``, as ``transformers``' ``get_chat_template`` picks it for
vLLM; the others with ``default``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_gateway_chat_template_options import USER

from support.tokenizers import write_model
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.tokenizer import HfChatTokenizer

DEFAULT = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
TOOL_USE = (
    "<tools>{{ tools | length }}</tools>"
    "{% for m in messages %}[{{ m.role }}|tools] {{ m.content }}\n{% endfor %}"
)
TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {}}}]


def _named_in_config(directory: Path) -> Path:
    write_model(directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = [
        {"name": "default", "template": DEFAULT},
        {"name": "tool_use", "template": TOOL_USE},
    ]
    config_file.write_text(json.dumps(config))
    return directory


def _named_in_files(directory: Path) -> Path:
    write_model(directory)
    (directory / "chat_template.jinja").write_text(DEFAULT)
    extra = directory / "additional_chat_templates"
    extra.mkdir()
    (extra / "tool_use.jinja").write_text(TOOL_USE)
    return directory


@pytest.mark.parametrize("layout", [_named_in_config, _named_in_files])
def test_requests_with_tools_render_with_the_tool_use_template(
    tmp_path: Path, layout: Callable[[Path], Path]
) -> None:
    tok = HfChatTokenizer.from_dir(layout(tmp_path))
    assert tok.render_chat(USER) == "[user] where is the cache?\n"
    with_tools = "[user|tools] where is the cache?\n"
    assert tok.render_chat(USER, tools=TOOLS) == "<tools>1</tools>" + with_tools
    assert tok.render_chat(USER, tools=[]) == "<tools>0</tools>" + with_tools  # [] is not None


def test_a_single_template_serves_requests_with_tools_too(tmp_path: Path) -> None:
    tok = HfChatTokenizer.from_dir(write_model(tmp_path, DEFAULT))
    assert tok.render_chat(USER, tools=TOOLS) == "[user] where is the cache?\n"


def test_named_templates_without_a_default_are_refused_at_load(tmp_path: Path) -> None:
    write_model(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = [{"name": "tool_use", "template": TOOL_USE}]
    config_file.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no default chat template"):
        HfChatTokenizer.from_dir(tmp_path)


def test_chat_template_jinja_replaces_only_the_default_of_a_named_list(tmp_path: Path) -> None:
    """transformers' order: tokenizer_config.json's list, then chat_template.jinja as default."""
    _named_in_config(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("plain: {{ messages[0].content }}")
    tok = HfChatTokenizer.from_dir(tmp_path)
    assert tok.render_chat(USER) == "plain: where is the cache?"
    assert tok.render_chat(USER, tools=TOOLS).startswith("<tools>1</tools>")


@pytest.mark.parametrize("name", ["chat_template.jinja", "additional_chat_templates/x.jinja"])
def test_a_template_file_that_is_not_utf8_is_refused_at_load(tmp_path: Path, name: str) -> None:
    write_model(tmp_path)
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"\xff\xfe{{ messages }}")
    with pytest.raises(ConfigError, match=f"{path.name}: cannot read"):
        HfChatTokenizer.from_dir(tmp_path)
