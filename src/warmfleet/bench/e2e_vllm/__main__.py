"""``python -m warmfleet.bench.e2e_vllm``."""

from __future__ import annotations

import sys

from warmfleet.bench.e2e_vllm.run import main

sys.exit(main())
