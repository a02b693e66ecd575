"""Shared test support, imported as ``support`` (``tests/`` is on pytest's ``pythonpath``).

One home for what several test folders need: the small engine they simulate (``engines``),
waiting for a condition with a deadline (``waiting``) and serving an app on 127.0.0.1
(``servers``). Helpers of one folder stay in that folder's ``*_support.py``; the fixtures shared
by every folder are registered by ``tests/conftest.py`` from ``support.fixtures``.
"""
