"""warmfleet.emulator: vLLM-compatible emulated engines driven by ``engine.model`` in wall time.

Public API: ``fleet.EmulatedFleet`` (async context manager, ``.urls``, ``.kill(i)``,
``.restart(i)``, ``.set_faults(i, FaultSpec)``), ``config.build_spec`` / ``EmulatorSpec`` /
``FaultSpec``, ``tokenizer.EmulatorTokenizer`` (a ``routing.keys.Tokenizer``), and the
``warmfleet emulate`` command (``cli.register``). See docs/emulator.md.
"""
