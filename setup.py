"""Build hook: the request path's modules compiled with mypyc (docs/compiled.md says why and
how). Everything else about the package is in pyproject.toml.

``WARMFLEET_COMPILE=0`` builds a pure-Python install; so does a machine without a C compiler
(each extension is optional: one that fails to build leaves its module interpreted).
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

# The modules every routed request runs through, and the pure routing core under them. Each is
# the same source interpreted or compiled; tests/test_compiled.py checks this list against
# what an install holds.
COMPILED = [
    "src/warmfleet/core/jsonio.py",
    "src/warmfleet/core/types.py",
    "src/warmfleet/api/replica_sync.py",
    "src/warmfleet/routing/canonical.py",
    "src/warmfleet/routing/chains.py",
    "src/warmfleet/routing/claims.py",
    "src/warmfleet/routing/exact_index.py",
    "src/warmfleet/routing/held_runs.py",
    "src/warmfleet/routing/index.py",
    "src/warmfleet/routing/pending_tails.py",
    "src/warmfleet/routing/key_modes.py",
    "src/warmfleet/routing/keys.py",
    "src/warmfleet/routing/ledger.py",
    "src/warmfleet/routing/parse.py",
    "src/warmfleet/routing/replica_notes.py",
    "src/warmfleet/routing/replicas.py",
    "src/warmfleet/routing/request.py",
    "src/warmfleet/routing/router.py",
    "src/warmfleet/routing/sessions.py",
    "src/warmfleet/routing/strategies/affinity_view.py",
    "src/warmfleet/routing/strategies/prefix_affinity.py",
    "src/warmfleet/gateway/http/answers.py",
    "src/warmfleet/gateway/http/messages.py",
    "src/warmfleet/gateway/http/routes.py",
    "src/warmfleet/gateway/http/upstream.py",
    "src/warmfleet/gateway/http/wire.py",
    "src/warmfleet/gateway/instance.py",
    "src/warmfleet/gateway/metrics.py",
    "src/warmfleet/gateway/openai/body.py",
    "src/warmfleet/gateway/openai/handlers.py",
    "src/warmfleet/gateway/proxy.py",
    "src/warmfleet/gateway/relay.py",
    "src/warmfleet/gateway/replica_sync/inbound.py",
    "src/warmfleet/gateway/replica_sync/router.py",
    "src/warmfleet/gateway/replica_sync/service.py",
    "src/warmfleet/gateway/replica_sync/transport.py",
    "src/warmfleet/gateway/variant.py",
    "src/warmfleet/gateway/world.py",
]

# mypy's options for the build, not the project's [tool.mypy] (its pydantic plugin and strict
# checks are for `make typecheck`). Third-party packages are never looked up, so a fresh build
# environment (no dependency installed yet) and a reinstall in a full venv compile the same code:
# their values are `Any` to mypyc. Modules imported but not compiled are read, not checked.
_MYPY_ARGS = [
    "--config-file=",
    "--python-version=3.11",
    "--no-site-packages",
    "--ignore-missing-imports",
    "--follow-imports=silent",
]


def _extensions() -> list[Extension]:
    if os.environ.get("WARMFLEET_COMPILE", "1") == "0":
        return []
    from mypyc.build import mypycify  # noqa: PLC0415 - a build requirement, not a runtime one

    extensions: list[Extension] = mypycify([*_MYPY_ARGS, *COMPILED], group_name="warmfleet")
    for extension in extensions:
        extension.optional = True  # no compiler: the module stays interpreted
    return extensions


setup(ext_modules=_extensions())
