"""warmfleet: keeps an LLM serving fleet warm.

Pure packages (synchronous, no I/O, injected clock and seeded ``random.Random``): ``core``,
``api`` (the contracts every shell speaks), ``routing``, ``engine``, ``cache``, ``control``,
``sim``. I/O shells around them: ``kube`` (the one Kubernetes client), ``gateway``, ``emulator``,
``agent`` (data plane, independent of one another), ``operator`` (control plane), ``bench``
(load generation and reports); composition roots: ``local`` (``warmfleet up``) and ``cli``. The
layers and contracts are in ``pyproject.toml`` (import-linter) and docs/architecture.md.
"""

__version__ = "0.1.0"
