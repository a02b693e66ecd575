"""Test harnesses, not part of the installed package: a local origin with fault injection and
Hugging Face routes (built on the product origin, ``warmfleet.local.origin``), Debian's
``docker-registry`` with tiny OCI images, a cache-root audit, the cache fault matrix and
``make bench-cache``, and the local fleet's acceptance run (``make bench-fleet``).

Imported by the tests as ``harness.*`` (``tests`` is on pytest's ``pythonpath``); the benchmarks
run as ``python -m harness.<module>`` with ``tests`` on ``PYTHONPATH`` (see the Makefile).
"""
