"""Base for typed configuration documents (pydantic v2, extra fields forbidden).

Every document kind spells its keys in camelCase (``maxBodyBytes``), the Kubernetes convention.
The old snake_case spelling (``max_body_bytes``) is still accepted, for one release: a document
read by ``parse_document`` logs one warning per old key (logger ``warmfleet.config``) naming the
new spelling; models built in code take the Python field names silently.

Pure: parses text and validates data; reading the files is the edges' job (``warmfleet.edge``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from warmfleet.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

OLD_SPELLING_UNTIL = "v0.3"


class StrictModel(BaseModel):
    """Every configuration model forbids unknown fields, is immutable and reads camelCase keys
    (``populate_by_name``: the Python field names too, as code and the old documents use).
    ``allow_inf_nan=False``: a float setting is finite (YAML ``.inf`` and JSON ``Infinity`` pass a
    ``ge``/``gt`` bound, then break the strategies, timers and health probes that use them)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
    )


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation can hold (through unions, containers, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            yield from _models_in(arg)


def new_spellings(model: Any) -> dict[str, str]:
    """Every field name of ``model`` (a model, or a type such as a union of models) and of the
    models inside it whose key is spelt otherwise."""
    renames: dict[str, str] = {}
    todo, seen = list(_models_in(model)), set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, info in current.model_fields.items():
            if info.alias is not None and info.alias != name:
                renames[name] = info.alias
            todo.extend(_models_in(info.annotation))
    return renames


def format_validation_error(err: ValidationError, source: str = "config", model: Any = None) -> str:
    """One line per problem, each naming the field path in the document's spelling
    (``spec.routing.prefixLength: ...``), also where the document used the old one; ``model``
    (the validated model or type) gives the spellings."""
    renames = new_spellings(model) if model is not None else {}
    lines = [
        f"{source}: {error_path(item, renames) or '<root>'}: {item['msg']}" for item in err.errors()
    ]
    return "\n".join(lines)


def error_path(item: ErrorDetails, renames: dict[str, str]) -> str:
    """The dotted field path of one validation error, field names in their new spelling (an
    unknown key as the input spelt it)."""
    loc = item["loc"]
    keep = len(loc) - 1 if item["type"] == "extra_forbidden" else len(loc)
    return ".".join(
        renames.get(p, p) if isinstance(p, str) and i < keep else str(p) for i, p in enumerate(loc)
    )


def old_spellings(value: object, data: object, path: str = "") -> list[tuple[str, str]]:
    """``(path of the key, new spelling)`` for each old-spelt key of the document ``data`` that
    validated into ``value``: walks both together, so unions and lists resolve as validated."""
    found: list[tuple[str, str]] = []
    if isinstance(value, BaseModel) and isinstance(data, dict):
        fields = type(value).model_fields
        by_alias: dict[str, str] = {
            info.alias: name for name, info in fields.items() if info.alias is not None
        }
        for key, raw in data.items():
            name = by_alias.get(key, key) if isinstance(key, str) else ""
            info = fields.get(name)
            if info is None:
                continue
            if key == name and info.alias is not None and info.alias != name:
                found.append((f"{path}{key}", info.alias))
            found.extend(old_spellings(getattr(value, name), raw, f"{path}{key}."))
    elif isinstance(value, (list, tuple)) and isinstance(data, list) and len(value) == len(data):
        for i, (item, raw) in enumerate(zip(value, data, strict=True)):
            found.extend(old_spellings(item, raw, f"{path}{i}."))
    elif isinstance(value, dict) and isinstance(data, dict):
        for key, raw in data.items():
            if key in value:
                found.extend(old_spellings(value[key], raw, f"{path}{key}."))
    return found


def validate_fields(model: type[M], data: Any, source: str = "config") -> M:
    """Validate data built in code into ``model`` (either spelling, silently) or raise
    ConfigError naming every bad field in the new spelling."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, model)) from err


def parse_document(model: type[M], data: Any, source: str = "config") -> M:
    """Validate a document into ``model`` or raise ConfigError naming every bad field. Each key
    in the old snake_case spelling is logged once (logger ``warmfleet.config``) with its first
    place in the document, how many more places use it and its new spelling."""
    result = validate_fields(model, data, source)
    seen: dict[str, tuple[str, str, int]] = {}  # old key -> (first path, new spelling, count)
    for path, new in old_spellings(result, data):
        key = path.rsplit(".", 1)[-1]
        first, _, count = seen.get(key, (path, new, 0))
        seen[key] = (first, new, count + 1)
    log = logging.getLogger("warmfleet.config")
    for first, new, count in seen.values():
        more = f" (and {count - 1} more)" if count > 1 else ""
        log.warning(
            "%s: %s%s: old spelling, use %s (accepted until %s)",
            source,
            first,
            more,
            new,
            OLD_SPELLING_UNTIL,
        )
    return result


def load_yaml_text(text: str, source: str = "config") -> Any:
    """Parse a YAML (or JSON) document; invalid YAML is a ConfigError naming ``source``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from err
    except RecursionError as err:  # PyYAML's parser and composer recurse per nesting level
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from err
