"""Fleet file validation, start-time figures, the emulator's real weights load."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from support.servers import serving
from warmfleet.core.errors import ConfigError
from warmfleet.emulator.weights import WeightsLoadError, load_weights
from warmfleet.local.config import load_fleet, parse_fleet
from warmfleet.local.infra import start_gateway
from warmfleet.local.origin_proc import generate_model
from warmfleet.local.state import in_flight_by_instance, start_times

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def _doc(uri: str = "origin://demo", revision: str = "v1") -> dict[str, object]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "LocalFleet",
        "spec": {
            "nodes": [{"name": "a", "budget": "1GiB"}],
            "origin": {"models": [{"name": "demo", "size": "10MB", "revisions": ["v1"]}]},
            "endpoints": [
                {
                    "name": "demo",
                    "spec": {
                        "modelSource": {"uri": uri, "revision": revision},
                        "image": "x",
                        "variants": [{"name": "main"}],
                    },
                }
            ],
        },
    }


def test_example_fleet_file_is_valid() -> None:
    fleet = load_fleet(EXAMPLE)
    assert [n.name for n in fleet.spec.nodes] == ["node-a", "node-b", "node-c"]
    assert fleet.spec.endpoints[0].spec.model_cache_config.weights_cache.enabled


@pytest.mark.parametrize(
    ("uri", "revision", "field"),
    [("s3://b/m", "v1", "modelSource.uri"), ("origin://demo", "v9", "modelSource")],
)
def test_unknown_model_sources_are_rejected_naming_the_field(
    uri: str, revision: str, field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_fleet(_doc(uri, revision))


def test_a_crash_backoff_cap_below_its_start_is_rejected_naming_the_field() -> None:
    doc = _doc()
    spec = doc["spec"]
    assert isinstance(spec, dict)
    spec["engine"] = {"type": "emulator", "crashBackoffS": 30, "crashBackoffMaxS": 5}
    with pytest.raises(ConfigError, match="crashBackoffMaxS"):
        parse_fleet(doc)
    spec["engine"] = {"type": "emulator", "crashBackoffS": 5, "crashBackoffMaxS": 5}
    assert parse_fleet(doc).spec.engine.crash_backoff_max_s == 5


async def test_an_unresolvable_gateway_host_names_the_fleet_files_field(tmp_path: Path) -> None:
    doc = _doc()
    spec = doc["spec"]
    assert isinstance(spec, dict)
    spec["gateway"] = {"host": "no-such-host.invalid"}
    with pytest.raises(ConfigError, match=r"^spec\.gateway\.host: cannot resolve"):
        await start_gateway(parse_fleet(doc).spec, tmp_path)


def test_duplicate_nodes_and_unknown_fields_are_rejected() -> None:
    doc = _doc()
    doc["spec"]["nodes"] = [{"name": "a", "budget": 1}, {"name": "a", "budget": 1}]  # type: ignore[index]
    with pytest.raises(ConfigError, match="unique"):
        parse_fleet(doc)
    doc = _doc()
    doc["spec"]["bogus"] = 1  # type: ignore[index]
    with pytest.raises(ConfigError, match="bogus"):
        parse_fleet(doc)


@pytest.mark.parametrize("name", ["../../escaped", "Upper", "a" * 31, "-x"])
def test_an_endpoint_name_that_names_files_is_a_dns_label(name: str) -> None:
    """``../../escaped`` wrote its instance file outside the workdir."""
    doc = _doc()
    doc["spec"]["endpoints"][0]["name"] = name  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"spec\.endpoints\.0\.name"):
        parse_fleet(doc)


def test_duplicate_endpoints_models_and_odd_revisions_are_rejected_at_load() -> None:
    doc = _doc()
    doc["spec"]["endpoints"] *= 2  # type: ignore[index]
    with pytest.raises(ConfigError, match="endpoint names must be unique"):
        parse_fleet(doc)
    doc = _doc()
    doc["spec"]["origin"]["models"] *= 2  # type: ignore[index]
    with pytest.raises(ConfigError, match="model names must be unique"):
        parse_fleet(doc)
    doc = _doc(revision="../x")
    doc["spec"]["origin"]["models"][0]["revisions"] = ["../x"]  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"revisions\.0"):
        parse_fleet(doc)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.1, 100.0)), max_size=12))
def test_start_times_split_warm_and_cold(starts: list[tuple[bool, float]]) -> None:
    history = [{"prepared": p, "timeToReadyS": t, "weightsLoadS": t / 2} for p, t in starts]
    out = start_times(history)
    assert out["warmStarts"] == sum(1 for p, _ in starts if p)
    assert out["coldStarts"] == sum(1 for p, _ in starts if not p)
    cold = sum(1 for p, _ in starts if not p)
    assert out["unpreparedReplicaShare"] == (cold / len(starts) if starts else 0.0)
    if out["warmStarts"]:
        warm = [t for p, t in starts if p]
        assert min(warm) <= out["warmStartS"] <= max(warm)


def test_in_flight_by_instance_sums_the_gateway_gauge() -> None:
    text = (
        "# TYPE warmfleet_gateway_in_flight_requests gauge\n"
        'warmfleet_gateway_in_flight_requests{endpoint="e",variant="v",instance_id="r1"} 2.0\n'
        'warmfleet_gateway_in_flight_requests{endpoint="e",variant="w",instance_id="r1"} 1.0\n'
        'warmfleet_gateway_in_flight_requests{endpoint="e",variant="v",instance_id="r2"} 0.0\n'
    )
    assert in_flight_by_instance(text) == {"r1": 3.0, "r2": 0.0}


def test_generated_models_are_deterministic_and_distinct(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_model(a, 3_000_001, "m@v1")
    generate_model(b, 3_000_001, "m@v1")
    generate_model(c, 3_000_001, "m@v2")
    assert a.stat().st_size == 3_000_001
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


async def test_weights_are_read_from_a_directory_and_a_url(tmp_path: Path) -> None:
    (tmp_path / "w" / "sub").mkdir(parents=True)
    (tmp_path / "w" / "a.bin").write_bytes(b"x" * 1000)
    (tmp_path / "w" / "sub" / "b.bin").write_bytes(b"y" * 500)
    local = await load_weights(str(tmp_path / "w"))
    assert local.bytes_read == 1500

    async def weights(_request: web.Request) -> web.Response:
        return web.Response(body=b"z" * 123_456)

    async with serving({"/w.bin": weights}) as (url, _):
        remote = await load_weights(f"{url}/w.bin")
        assert remote.bytes_read == 123_456
        with pytest.raises(WeightsLoadError, match="HTTP 404"):
            await load_weights(f"{url}/missing")
    with pytest.raises(WeightsLoadError, match="does not exist"):
        await load_weights(str(tmp_path / "missing"))
