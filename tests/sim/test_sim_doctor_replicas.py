"""`warmfleet doctor` with sessions and gateway replicas: a trace's sessions key its replays (as
the live gateway's keys carried them), `prefix_affinity` with `sessionPlacement: hash` is
replayed beside the strategies, `--gateway-replicas`/`--sync-delay-ms` replay replicas, and
`--kv-events-delay-ms` engines that publish KV events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from support.doctor_captures import capture_lines, write_capture
from warmfleet.api.trace_format import TraceRecord
from warmfleet.bench import doctor_cli
from warmfleet.core.types import Reason
from warmfleet.sim import doctor
from warmfleet.sim.doctor_run import SESSION_HASH_RUN, run_doctor
from warmfleet.sim.trace_fleet import trace_scenario
from warmfleet.sim.workloads.traces import Trace, parse_trace_text

app = typer.Typer()
doctor_cli.register(app)
app.command("noop")(lambda: None)  # two commands: `doctor` stays a subcommand


def _doctor(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["doctor", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def _without_sessions(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        row = json.loads(line)
        row.pop("session", None)
        out.append(json.dumps(row))
    return out


def _session_decisions(path: Path) -> int:
    """``prefix_affinity``'s decisions of reason ``session`` in the doctor's replay of ``path``."""
    data = Trace(path.read_text(), str(path))
    parsed = parse_trace_text(data)
    result = run_doctor(trace_scenario(data, parsed.header), data, parsed)
    reasons = result.run("prefix_affinity").metrics.decisions_by_reason
    return reasons.get(str(Reason.SESSION), 0)


def test_a_capture_with_sessions_keys_its_replays(tmp_path: Path) -> None:
    lines = capture_lines(300, rate_rps=2.0)
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, lines)
    records = [TraceRecord.model_validate_json(line) for line in lines[1:]]
    sessions = len({r.session for r in records})  # the generator's names carry their tenant
    assert sessions > 1
    assert doctor.session_count(records) == sessions
    doc = _doctor(str(trace))
    assert doc["sessions"] == sessions
    assert SESSION_HASH_RUN in doc["strategies"]
    assert _session_decisions(trace) > 0  # turns routed to their session's home

    plain = tmp_path / "plain.jsonl"
    write_capture(plain, _without_sessions(lines))
    doc = _doctor(str(plain))
    assert doc["sessions"] == 0
    assert SESSION_HASH_RUN not in doc["strategies"]
    assert _session_decisions(plain) == 0


def test_replicas_without_sync_lose_what_sync_keeps(tmp_path: Path) -> None:
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, capture_lines(2000, rate_rps=8.0))
    one = _doctor(str(trace))
    apart = _doctor(str(trace), "--gateway-replicas", "4", "--sync-delay-ms", "none",
                    "--report", str(tmp_path / "r"))  # fmt: skip
    synced = _doctor(str(trace), "--gateway-replicas", "4", "--sync-delay-ms", "5")
    fleets = [
        (d["fleet"]["gateway_replicas"], d["fleet"]["sync_delay_ms"]) for d in (one, apart, synced)
    ]
    assert fleets == [(1, 0.0), (4, None), (4, 5.0)]

    def hit(doc: dict[str, Any], name: str = "prefix_affinity") -> float:
        rate: float = doc["strategies"][name]["hit_rate"]
        return rate

    # each replica learns only its own routings: conversations scatter over the instances
    assert hit(apart) < hit(one) - 0.05
    assert abs(hit(synced) - hit(one)) < 0.02
    # a session's hash places its turns alike on every replica, heard of or not
    assert hit(apart, SESSION_HASH_RUN) > hit(apart)
    # the captured placements are replayed as the fleet served them, whatever the replicas
    assert apart["captured"]["hit_rate"] == one["captured"]["hit_rate"]
    text = (tmp_path / "r" / "doctor.md").read_text(encoding="utf-8")
    assert "4 gateway replicas (no sync)" in text
    assert f"{one['sessions']} sessions" in text
    # with the engines' KV events every replica hears every engine: most of it comes back
    heard = _doctor(str(trace), "--gateway-replicas", "4", "--sync-delay-ms", "none",
                    "--kv-events-delay-ms", "5")  # fmt: skip
    assert heard["fleet"]["kv_events_delay_ms"] == 5.0
    assert one["fleet"]["kv_events_delay_ms"] is None
    assert hit(heard) > hit(apart) + 0.03


def test_bad_replica_options_are_refused(tmp_path: Path) -> None:
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, capture_lines(20))
    for args in (
        ["--sync-delay-ms", "1,2"],
        ["--sync-delay-ms", "-1"],
        ["--gateway-replicas", "0"],
        ["--kv-events-delay-ms", "-1"],
        ["--kv-events-delay-ms", "inf"],
    ):
        result = CliRunner().invoke(app, ["doctor", str(trace), *args])
        assert result.exit_code == 2, (args, result.output)
        assert args[0] in result.output


def test_requests_replays_the_first_n_of_a_capture(tmp_path: Path) -> None:
    """``--requests N``: the first N records, for every figure (the replays, the captured
    placements, the live hit rate); the same as a capture cut at N lines."""
    lines = capture_lines(300, rate_rps=2.0)
    trace, cut = tmp_path / "capture.jsonl", tmp_path / "cut.jsonl"
    write_capture(trace, lines)
    write_capture(cut, lines[:41])  # the header and 40 records
    doc = _doctor(str(trace), "--requests", "40")
    assert doc["requests"] == 40  # before: no such option
    assert doc["captured"]["placed_requests"] == 40
    whole = _doctor(str(cut))
    for name in ("requests", "waterfall", "strategies", "best_strategy", "sessions"):
        assert doc[name] == whole[name], name
    assert _doctor(str(trace), "--requests", "1000")["requests"] == 300  # a trace shorter
