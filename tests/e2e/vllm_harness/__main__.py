"""``python -m vllm_harness`` (with ``tests/e2e`` on ``PYTHONPATH``)."""

from __future__ import annotations

import sys

from vllm_harness.run import main

sys.exit(main())
