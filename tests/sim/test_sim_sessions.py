"""Sessions across simulated gateway replicas: keys carrying each request's session keep a
session's turns on one instance whichever replica a turn reaches (learnt from the peers'
notes), at the hit rate of one gateway.

The workload is an agent program per session: every call repeats the session's context (a
quarter of the prompt) and then varies. To the prefix index the match is too short to be strong,
so without sessions each call is placed as a new group; placement weighs what each instance
holds, and on this workload it lands on the context's instance too (the same hit rate): the
sessions make the affinity explicit (reason ``session``), they do not beat prefix routing here.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import typer
from typer.testing import CliRunner

from support.engines import engine_spec
from warmfleet.bench import sim_cli
from warmfleet.core.types import RoutingKey
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.sim.gateways import GatewaySync
from warmfleet.sim.metrics import compute_metrics
from warmfleet.sim.runner import prepare, routing_keys
from warmfleet.sim.scenario import ScenarioSpec
from warmfleet.sim.simulator import SimConfig, SimResult, Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.synthetic import MultiRoundQaConfig

SPEC = engine_spec(
    name="sim-sessions", kv_capacity_tokens=400 * 16, max_model_len=8192,
    prefill_s_per_token=0.0002, prefill_attn_s_per_token_pair=1e-8, decode_s_per_seq=0.001,
    kv_read_s_per_token=1e-7,
)  # fmt: skip
SESSIONS, CALLS = 24, 6
APP = typer.Typer()
sim_cli.register(APP)


def _programs() -> list[WorkloadRequest]:
    out: list[WorkloadRequest] = []
    for _call in range(CALLS):
        for session in range(SESSIONS):
            index = len(out)
            segments = (Segment(10_000 + session, 256), Segment(1_000_000 + index, 768))
            arrival_s = index / 8.0
            out.append(WorkloadRequest(index, arrival_s, segments, 32, session_id=session))
    return out


def _run(
    replicas: int, sessions: bool, delay_s: float | None = 0.001, placement: str = "groups"
) -> tuple[SimResult, list[RoutingKey], float]:
    requests = _programs()
    keys = routing_keys(
        prepare(requests, SPEC.block_tokens), DEFAULT_PREFIX_LENGTH, sessions=sessions
    )
    config = strategy_config("prefix_affinity", session_placement=placement)
    gateways = GatewaySync(replicas, delay_s).build(
        lambda r: build_strategy(config, random.Random(r)),
        random.Random(0),
    )
    result = Simulator(SimConfig(4, SPEC), gateways, requests, keys).run()
    hit_rate = compute_metrics(result, keys, SPEC.block_tokens, SPEC.capacity_blocks * 4).hit_rate
    return result, keys, hit_rate


def test_keys_carry_the_workloads_sessions_only_when_asked() -> None:
    requests = _programs()
    prepared = prepare(requests, SPEC.block_tokens)
    assert all(k.session is None for k in routing_keys(prepared, DEFAULT_PREFIX_LENGTH))
    keys = routing_keys(prepared, DEFAULT_PREFIX_LENGTH, sessions=True)
    assert len({k.session for k in keys}) == SESSIONS
    assert not ScenarioSpec(name="s", workload=MultiRoundQaConfig()).sessions


def test_synced_replicas_keep_each_session_home_at_one_gateways_hit_rate() -> None:
    _, _, one = _run(1, sessions=True)
    result, _, four = _run(4, sessions=True)
    assert four >= one - 0.02
    assert one > 0.15  # the sessions' contexts are reused (a quarter of each prompt)
    records = sorted(result.records, key=lambda r: r.arrival_s)
    home: dict[int | None, str] = {}
    for record in records:
        session = _programs()[record.index].session_id
        if session in home and record.instance_id != home[session]:
            assert record.reason != "session"  # only the load bound moves a session
        elif session in home:
            assert record.reason == "session"
        home[session] = record.instance_id
    moved = sum(r.reason != "session" for r in records) - SESSIONS
    assert moved <= len(records) // 20
    # without sessions every call is a new group to the router (it may still land on the
    # context's instance: placement weighs what each instance holds)
    plain, _, _ = _run(4, sessions=False)
    assert not any(r.reason == "session" for r in plain.records)


def test_replicas_without_sync_keep_sessions_home_when_placed_by_hash() -> None:
    """No sync at all (a partition, a blocked sync port), ``session_placement: hash``: a
    session's first call is placed by its session's hash among the least-loaded instances, so a
    replica that never heard of the session places its next calls there too, and sessions keep
    one instance (but for calls a replica's load band moved: 4 of 24). With the default each
    replica gives a session its own home: 6.2 % here against one gateway's 20.8 %. By hash it
    reads 13.5 %, still under one gateway's: the 24 programs spread 7/7/6/4 as hashed, where one
    gateway rotates them 6 to an instance, and 7 programs overflow an instance's cache."""
    _, _, one = _run(1, sessions=True)
    result, _, four = _run(4, sessions=True, delay_s=None, placement="hash")
    programs = _programs()
    homes: dict[int | None, set[str]] = {}
    for record in result.records:
        homes.setdefault(programs[record.index].session_id, set()).add(record.instance_id)
    assert sum(len(h) > 1 for h in homes.values()) <= SESSIONS // 4
    assert len(set().union(*homes.values())) == 4  # the sessions spread over the fleet
    _, _, grouped = _run(4, sessions=True, delay_s=None)
    assert four >= 0.6 * one
    assert four > 1.5 * grouped


def test_the_cli_runs_sessions_when_asked(tmp_path: Path) -> None:
    args = [
        "sim", "--scenario", "multi-round-qa", "--preset", "tiny-cpu", "--instances", "3",
        "--requests", "40", "--strategies", "prefix_affinity", "--gateway-replicas", "2",
    ]  # fmt: skip
    reasons = []
    for extra in ([], ["--sessions"]):
        out = tmp_path / "replicas.json"
        result = CliRunner().invoke(APP, [*args, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        cell = json.loads(out.read_text())["strategies"]["prefix_affinity"][-1]
        assert cell["gateway_replicas"] == 2
        reasons.append(cell["metrics"]["decisions_by_reason"])
    assert "session" not in reasons[0]
    assert reasons[1]["session"] > 0


def _hash_placement(tmp_path: Path) -> Path:
    """A ``--strategy-config`` file: ``prefix_affinity`` placing sessions by hash."""
    path = tmp_path / "hash.yaml"
    path.write_text("type: prefix_affinity\nsessionPlacement: hash\n", encoding="utf-8")
    return path


def test_the_cli_runs_a_strategy_with_other_settings(tmp_path: Path) -> None:
    """``--strategy-config``: a strategy's settings in place of its defaults, named in the
    report; sessions placed by hash keep one gateway's hit rate on unsynced replicas."""
    hashed = _hash_placement(tmp_path)
    args = [
        "sim", "--scenario", "multi-round-qa", "--strategies", "prefix_affinity", "--sessions",
        "--gateway-replicas", "1,4", "--sync-delay-ms", "none",
    ]  # fmt: skip
    cells = []
    for extra in ([], ["--strategy-config", str(hashed)]):
        out = tmp_path / "replicas.json"
        result = CliRunner().invoke(APP, [*args, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        report = json.loads(out.read_text())
        cells.append(report["strategies"]["prefix_affinity"])
        configs = report["strategy_configs"]
    assert configs == {"prefix_affinity": "sessionPlacement=hash"}
    (one, grouped), (one_hashed, hashed_four) = cells
    assert grouped["hit_rate"] < one["hit_rate"] - 0.05  # unsynced: each replica its own home
    assert hashed_four["hit_rate"] >= one_hashed["hit_rate"] - 0.02


def test_the_comparison_says_which_strategy_ran_with_other_settings(tmp_path: Path) -> None:
    hashed = _hash_placement(tmp_path)
    args = ["sim", "--scenario", "multi-round-qa", "--strategies", "prefix_affinity,random"]
    out = tmp_path / "comparison.json"
    result = CliRunner().invoke(APP, [*args, "--strategy-config", str(hashed), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "prefix_affinity: sessionPlacement=hash" in result.output  # the table's title
    report = json.loads(out.read_text())
    assert report["strategy_configs"] == {"prefix_affinity": "sessionPlacement=hash"}


def test_the_cli_refuses_a_strategy_config_it_cannot_use(tmp_path: Path) -> None:
    args = ["sim", "--scenario", "multi-round-qa", "--strategies", "prefix_affinity,random"]
    cases = {
        "type: prefix_affinity\nsessionPlacement: everywhere\n": "sessionPlacement",
        "type: prefix_hash\n": "not in --strategies: 'prefix_hash'",
        "sessionPlacement: hash\n": "with its type",
        "- type: random\n": "with its type",
    }
    for text, expected in cases.items():
        path = tmp_path / "strategy.yaml"
        path.write_text(text, encoding="utf-8")
        result = CliRunner().invoke(APP, [*args, "--strategy-config", str(path)])
        assert result.exit_code == 2, result.output
        assert expected in result.output, result.output
        assert str(path) in result.output, result.output
    twice = ["--strategy-config", str(path), "--strategy-config", str(path)]
    path.write_text("type: random\n", encoding="utf-8")
    result = CliRunner().invoke(APP, [*args, *twice])
    assert result.exit_code == 2
    assert "a second file for 'random'" in result.output
