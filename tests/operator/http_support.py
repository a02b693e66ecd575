"""The local-fleet tests' name for ``support.servers`` (a GET-routes app on 127.0.0.1); the
operator tests import ``support.servers`` directly. Goes once those tests do too."""

from __future__ import annotations

from support.servers import Handler, serving

__all__ = ["Handler", "serving"]
