"""warmfleet.bench: load generation, benchmarks and their reports (an I/O shell).

``loadgen`` (``warmfleet loadgen``) drives OpenAI-compatible servers; ``live_*`` runs the demo's
embedded fleet; ``routing_bench``, ``peers`` and ``conformance`` measure the gateway against
baselines and peer routers; reports and plots are written under ``bench-results/``. It may import
every shell's public entry points and the pure core, never ``warmfleet.local`` or ``warmfleet.cli``.
Harnesses that need test doubles (the cache bench and its fault matrix) live under
``tests/harness``.
"""
