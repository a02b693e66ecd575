"""warmfleet: keeps an LLM serving fleet warm.

Pure packages (no I/O): ``core``, ``routing``, ``engine``, ``sim``, ``cache``.
I/O shells around them: ``gateway``, ``emulator``, ``agent``, ``operator``, ``bench``.
"""

__version__ = "0.1.0"
