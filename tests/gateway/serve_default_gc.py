"""``warmfleet serve`` with Python's default garbage collector settings (no
``tune_gc_for_serving``): the memory tests run the gateway both ways.
Usage: ``python serve_default_gc.py --config PATH --log-level LEVEL``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from warmfleet.gateway.server import StartedApp, run


def main(argv: list[str]) -> None:
    config = Path(argv[argv.index("--config") + 1])
    logging.basicConfig(level=argv[argv.index("--log-level") + 1].upper())

    def ready(started: StartedApp) -> None:
        print(f"warmfleet gateway listening on {started.url}", flush=True)

    run(config, ready, tune_gc=False)


if __name__ == "__main__":
    main(sys.argv)
