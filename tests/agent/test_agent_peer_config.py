"""The fleet's ``spec.peers.renewS``: a typed setting checked at load (positive, at most half the
tracker's stall bound, named when refused), carried in the node's assignment (``renewS``) to the
fill loop's ``PeerConfig.renew_s``; an assignment with a value that is not a positive number is
refused by the agent."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from cache_support import manager_for
from peer_support import PIECE, TOKEN, serving

from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_node import Peers
from warmfleet.agent.peer_run import DEFAULT_RENEW_S, PeerConfig
from warmfleet.core.errors import ConfigError
from warmfleet.local.config import PeersConfig, parse_fleet
from warmfleet.local.tracker_host import TrackerHost


def _fleet(peers: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {
            "nodes": [{"name": "n0", "budget": "1GiB"}],
            "origin": {"models": [{"name": "m", "size": 1024, "revisions": ["r1"]}]},
            "peers": {"enabled": True, **peers},
        }
    }


def test_renew_s_is_read_from_the_fleet_document() -> None:
    assert parse_fleet(_fleet({})).spec.peers.renew_s == DEFAULT_RENEW_S == 10.0
    assert parse_fleet(_fleet({"renewS": 2.5})).spec.peers.renew_s == 2.5
    peers = parse_fleet(_fleet({"stallS": 5, "renewS": 25})).spec.peers  # bound 50 s
    assert (peers.tracker_stall_s, peers.renew_s) == (50.0, 25.0)


@pytest.mark.parametrize(
    ("peers", "message"),
    [
        ({"renewS": 0}, "greater than 0"),
        ({"renewS": -1}, "greater than 0"),
        ({"renewS": "soon"}, "valid number"),
        ({"renewS": 15.5}, "at most half the tracker's stall bound"),  # bound: max(30, 20)
        ({"stallS": 5, "renewS": 26}, "= 50 s"),
    ],
)
def test_a_bad_renew_s_is_refused_at_load_naming_the_field(
    peers: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"spec\.peers\.renewS") as err:
        parse_fleet(_fleet(peers))
    assert message in str(err.value)


def test_the_tracker_host_uses_the_bound_the_config_checks_against() -> None:
    config = PeersConfig(enabled=True, stall_s=4.0)
    host = TrackerHost(config, TOKEN)
    assert host.tracker.options.stall_s == config.tracker_stall_s == 40.0
    assert TrackerHost(PeersConfig(), TOKEN).tracker.options.stall_s == 30.0


def _fill_config(peers: Peers) -> PeerConfig:
    hook = peers._manager.fill_hook
    assert hook is not None
    fill = getattr(hook, "__self__", None)
    assert isinstance(fill, PeerFill)
    return fill.config


async def test_the_fleets_renew_s_reaches_the_fill_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE, renew_s=3.5), TOKEN)
    await host.start()
    try:
        async with manager_for(tmp_path / "a") as a, serving(a) as (peers, url):
            extra = host.assignment_extra("a", url)
            assert extra["peers"]["renewS"] == 3.5
            peers.configure(extra["peers"])
            assert _fill_config(peers).renew_s == 3.5
            peers.configure({k: v for k, v in extra["peers"].items() if k != "renewS"})
            assert _fill_config(peers).renew_s == DEFAULT_RENEW_S  # an older fleet's document
    finally:
        await host.stop()


@pytest.mark.parametrize("value", [0, -2.0, math.inf, math.nan, "5", True, [5]])
async def test_an_assignment_with_a_bad_renew_s_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object
) -> None:
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with manager_for(tmp_path / "a") as a, serving(a) as (peers, url):
        doc = {"tracker": "http://t", "node": "a", "url": url, "renewS": value}
        with pytest.raises(ValueError, match=r"peers\.renewS"):
            peers.configure(doc)
        assert a.fill_hook is None  # nothing configured
