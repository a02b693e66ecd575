"""``warmfleet conformance --engine URL --gateway-tokenizer DIR`` as the README shows it: the
installed script, in a subprocess, against the fake vLLM of ``test_e2e_conformance``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from e2e_tokenizer_helpers import write_model
from test_e2e_conformance import fake_vllm

from support.servers import app_serving

WARMFLEET = str(Path(sys.executable).parent / "warmfleet")


@pytest.mark.slow
async def test_conformance_command_agrees_with_the_engine(tmp_path: Path) -> None:
    model = tmp_path / "engine-model"
    model.mkdir()
    app = fake_vllm(write_model(model))
    async with app_serving(app, access_log=None) as (url, _):
        proc = await asyncio.create_subprocess_exec(
            WARMFLEET, "conformance", "--engine", url, "--gateway-tokenizer", str(model),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=90)
    text = stdout.decode()
    assert proc.returncode == 0, f"{text}\n{stderr.decode()}"
    assert text.splitlines()[-1].startswith("OK: predicted ")
    assert "turn 3:" in text  # --turns defaults to 4
