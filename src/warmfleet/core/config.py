"""Base for typed configuration documents (pydantic v2, extra fields forbidden).

Pure: parses text and validates data; reading the files is the edges' job (``warmfleet.edge``).
"""

from __future__ import annotations

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


def load_yaml_text(text: str, source: str = "config") -> Any:
    """Parse a YAML (or JSON) document; invalid YAML is a ConfigError naming ``source``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from err
