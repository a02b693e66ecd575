"""The request path is compiled with mypyc (setup.py, docs/compiled.md): every module it lists is
loaded from its extension unless the install opted out with ``WARMFLEET_COMPILE=0``."""

from __future__ import annotations

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

from support.compiled import compiled_sources, module_name


@pytest.mark.skipif(
    os.environ.get("WARMFLEET_COMPILE") == "0", reason="a pure-Python install was asked for"
)
def test_every_listed_module_is_loaded_compiled() -> None:
    interpreted = []
    for source in compiled_sources():
        assert source.exists(), f"setup.py lists {source}, which does not exist"
        module = importlib.import_module(module_name(source))
        if not str(module.__file__).endswith(tuple(EXTENSION_SUFFIXES)):
            interpreted.append(module.__name__)
    assert not interpreted, (
        f"interpreted, not compiled: {interpreted} (no C compiler at install time? "
        "install gcc, or set WARMFLEET_COMPILE=0 for a pure-Python install and test run)"
    )
