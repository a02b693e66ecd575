"""Helpers for the documentation tests: the README and docs/configuration.md, their sections,
code blocks and tables, model trees, and the default of a setting path."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"  # the configuration reference, out of the README
EXAMPLES = ROOT / "examples"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def section(text: str, heading: str) -> str:
    """The body of the Markdown section ``heading`` (up to the next heading of its level or
    higher)."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    end = len(lines)
    for i in range(start + 1, len(lines)):
        match = re.match(r"^(#+) ", lines[i])
        if match and len(match.group(1)) <= level:
            end = i
            break
    return "\n".join(lines[start + 1 : end])


def code_blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """(line number, body) of every fenced block tagged ``lang``."""
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in _FENCE.finditer(text)
        if m.group(1) == lang
    ]


def top_level_chunks(block: str) -> list[str]:
    """Split a YAML block at every line that starts in column 0 (not a comment): alternatives
    such as three ``discovery:`` lines are validated one by one."""
    chunks: list[list[str]] = []
    for line in block.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    return ["\n".join(c) for c in chunks]


def tables_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells as raw strings) of the first Markdown table after the line ``marker``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(marker))
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(cells)
    return rows[1:]  # without the header


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _models_in(typing.get_args(annotation)[0])
        return
    if origin is not None or isinstance(annotation, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def model_tree(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and every model reachable through its fields (unions, lists, optionals)."""
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    return seen


def field_name(model: type[BaseModel], key: str) -> str:
    """The Python name of the field a document spells ``key`` (its camelCase alias, or the
    name itself); ``KeyError`` if ``model`` has no such field."""
    if key in model.model_fields:
        return key
    for name, field in model.model_fields.items():
        if field.alias == key:
            return name
    raise KeyError(key)


def document_key(model: type[BaseModel], name: str) -> str:
    """How a document spells the field ``name`` of ``model`` (its alias, if it has one)."""
    return model.model_fields[name].alias or name


def field_at(root: type[BaseModel], path: str) -> tuple[type[BaseModel], str]:
    """(owning model, field name) of a dotted ``path`` (document keys) below ``root``;
    ``KeyError`` if absent. Through a union of models the first member that has the next field
    is taken."""
    model = root
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        candidates = _models_in(model.model_fields[field_name(model, part)].annotation)
        found = next((m for m in candidates if _has(m, parts[i + 1])), None)
        if found is None:
            raise KeyError(path)
        model = found
    return model, field_name(model, parts[-1])


def _has(model: type[BaseModel], key: str) -> bool:
    try:
        field_name(model, key)
    except KeyError:
        return False
    return True


def default_of(model: type[BaseModel], key: str) -> Any:
    field = model.model_fields[field_name(model, key)]
    if field.is_required():
        return "<required>"
    return field.get_default(call_default_factory=True)


README_TEXT = README.read_text(encoding="utf-8")
CONFIGURATION_TEXT = CONFIGURATION.read_text(encoding="utf-8")
_CHECKED_DOCS = (("README.md", README_TEXT), ("docs/configuration.md", CONFIGURATION_TEXT))


def _default_at(root: type[BaseModel], path: str) -> Any:
    """The default of ``path`` below ``root``: read from the parent's default object where there
    is one (``routing.strategy.type`` is the default strategy's), else the field's own."""
    parts = path.split(".")
    value: Any = None
    model: type[BaseModel] = root
    for i, part in enumerate(parts):
        if i == 0:
            value = default_of(model, part)
        elif isinstance(value, BaseModel):
            value = getattr(value, field_name(type(value), part))
        else:
            owner, name = field_at(root, path)
            return default_of(owner, name)
    return value
