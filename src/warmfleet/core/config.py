"""Base for typed configuration documents (pydantic v2, extra fields forbidden)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from warmfleet.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Every configuration model forbids unknown fields and is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line per problem, each naming the field path: ``spec.routing.prefix_length: ...``."""
    lines = []
    for item in err.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<root>"
        lines.append(f"{source}: {path}: {item['msg']}")
    return "\n".join(lines)


def parse_document(model: type[M], data: Any, source: str = "config") -> M:
    """Validate ``data`` into ``model`` or raise ConfigError naming every bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from err


def load_yaml_file(path: Path) -> Any:
    """Read and parse a YAML (or JSON) document file; an unreadable file is a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from err
    return load_yaml_text(text, str(path))


def load_yaml_text(text: str, source: str = "config") -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from err
