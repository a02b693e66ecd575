"""Load generator runs against in-test fake engines: closed and open loops, streaming, errors,
sessions, shares from gateway headers, the report files, answers with status 200 that are no
completion; and bench-peers' reference pass-through proxies relaying to those engines."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from bench_support import FakeEngine, small_gsp

from warmfleet.bench import peers_routers
from warmfleet.bench.live_fleet import FleetHandle
from warmfleet.bench.live_procs import ProcessSet, free_port
from warmfleet.bench.loadgen import LoadSpec, prepare_requests, run_load
from warmfleet.bench.loadgen_metrics import MetricsTarget, measure
from warmfleet.bench.loadgen_report import comparison_report, write_report
from warmfleet.bench.peers_routers import (
    PASSTHROUGH,
    PROTOCOL_PASSTHROUGH,
    PeerPaths,
    RouterSpec,
    start_router,
)
from warmfleet.sim.workloads.arrivals import PoissonArrival, apply_arrivals
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.synthetic import MultiRoundQaConfig, multi_round_qa


@pytest.fixture
async def engines() -> AsyncIterator[list[FakeEngine]]:
    pair = [FakeEngine("e0"), FakeEngine("e1")]
    for engine in pair:
        await engine.start()
    yield pair
    for engine in pair:
        await engine.stop()


async def test_closed_loop_direct_round_robin_and_engine_metrics(
    engines: list[FakeEngine],
) -> None:
    spec = LoadSpec(urls=tuple(e.url for e in engines), url_names=("e0", "e1"), concurrency=4)
    targets = [MetricsTarget(e.name, e.url + "/metrics") for e in engines]
    requests = small_gsp()
    load, summary = await measure(requests, spec, targets)
    assert len(load.results) == len(requests)
    assert all(r.ok for r in load.results)
    assert sum(e.requests for e in engines) == len(requests)
    assert summary["requests"] == {
        "submitted": 24, "completed": 24, "rejected": 0, "not_sent": 0,
    }  # fmt: skip
    # Direct mode: the instance is the URL; round robin gives an even split.
    share = summary["share"]
    assert isinstance(share, dict)
    assert share["min"] == pytest.approx(50.0)
    assert share["max"] == pytest.approx(50.0)
    assert summary["share_source"] == "client_round_robin"
    queries = sum(e.queries for e in engines)
    hits = sum(e.hits for e in engines)
    assert summary["hit_rate_source"] == "engine_metrics"
    assert summary["hit_rate"] == pytest.approx(hits / queries)
    assert hits > 0
    # Non-streamed: output tokens come from usage.
    assert all(r.output_tokens == 4 for r in load.results)


async def test_open_loop_poisson_sends_everything(engines: list[FakeEngine]) -> None:
    import random  # noqa: PLC0415

    timed = apply_arrivals(small_gsp(), PoissonArrival(rate_rps=400.0), random.Random(3))
    spec = LoadSpec(urls=(engines[0].url,))
    load = await run_load(timed, spec)
    assert len(load.results) == len(timed)
    assert load.not_sent == 0
    assert all(r.ok for r in load.results)
    assert engines[0].requests == len(timed)


async def test_open_loop_time_bound_stops_launching(engines: list[FakeEngine]) -> None:
    late = [WorkloadRequest(i, 0.0 if i < 3 else 3600.0, (Segment(i, 5),), 2) for i in range(6)]
    load = await run_load(late, LoadSpec(urls=(engines[0].url,), max_duration_s=1.0))
    assert len(load.results) == 3
    assert load.not_sent == 3


async def test_streaming_ttft_itl_and_usage(engines: list[FakeEngine]) -> None:
    engines[0].tokens = 5
    spec = LoadSpec(urls=(engines[0].url,), stream=True, concurrency=2)
    load = await run_load(small_gsp(8, output_tokens=16), spec)
    assert len(load.results) == 8
    for result in load.results:
        assert result.ok
        assert result.ttft_s is not None
        assert result.ttft_s <= result.e2e_s
        assert len(result.itl_s) == 4  # 5 content chunks -> 4 gaps (role chunk ignored)
        assert result.output_tokens == 5  # from the final usage chunk
        assert result.cached_tokens is not None
    body = engines[0].bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 16


async def test_errors_are_counted_not_raised(engines: list[FakeEngine]) -> None:
    engines[0].fail_every = 3
    load, summary = await measure(
        small_gsp(12), LoadSpec(urls=(engines[0].url,), concurrency=1), ()
    )
    assert summary["errors"] == {"http_500": 4}
    assert summary["requests"]["completed"] == 8  # type: ignore[index]
    assert summary["requests"]["rejected"] == 4  # type: ignore[index]
    engines[1].stream_error_every = 2
    load = await run_load(small_gsp(6), LoadSpec(urls=(engines[1].url,), stream=True))
    assert sorted(r.error or "" for r in load.results).count("stream_error") == 3


async def test_unreachable_url_is_a_connection_error(engines: list[FakeEngine]) -> None:
    port = engines[0].port
    await engines[0].stop()
    load = await run_load(small_gsp(3), LoadSpec(urls=(f"http://127.0.0.1:{port}",)))
    assert [r.error for r in load.results] == ["connection"] * 3


async def test_sessions_send_turns_in_order(engines: list[FakeEngine]) -> None:
    config = MultiRoundQaConfig(
        users=3, rounds=3, shared_system_prompt_tokens=5, user_history_prompt_tokens=5,
        question_tokens=3, answer_tokens=2,
    )  # fmt: skip
    requests = multi_round_qa(config, seed=2)
    load = await run_load(requests, LoadSpec(urls=(engines[0].url,), concurrency=4))
    assert all(r.ok for r in load.results)
    # Each turn's prompt extends the previous turn's, so per user the received prompt lengths
    # must increase in arrival order.
    by_user: dict[str, list[int]] = {}
    for words in engines[0].seen_prompts:
        history = words[5:10]  # the user's private history segment identifies the user
        by_user.setdefault(" ".join(history), []).append(len(words))
    assert len(by_user) == 3
    for lengths in by_user.values():
        assert lengths == sorted(lengths)
        assert len(set(lengths)) == len(lengths)


async def test_gateway_headers_give_shares(engines: list[FakeEngine]) -> None:
    for engine in engines:
        engine.instance_header = True
    _load, summary = await measure(
        small_gsp(10), LoadSpec(urls=(engines[0].url,), concurrency=2), ()
    )
    assert summary["share_source"] == "response_headers"
    assert summary["share"]["per_instance"] == {"e0": 100.0}  # type: ignore[index]


async def test_write_report_files(engines: list[FakeEngine], tmp_path: Path) -> None:
    load, summary = await measure(small_gsp(6), LoadSpec(urls=(engines[0].url,)), ())
    report = comparison_report({"scenario": "gsp", "instances": 1}, {"x": summary})
    paths = write_report(report, {"x": load}, tmp_path, "test")
    names = {p.name for p in paths}
    assert names == {"report.json", "report.md", "ttft_cdf.png", "share.png", "hit_rate.png"}
    assert json.loads((tmp_path / "report.json").read_text())["strategies"]["x"]["ttft_ms"]


_CHUNK = {"choices": [{"index": 0, "delta": {"content": "x"}}], "error": None}
_ANSWERS: dict[str, tuple[str, bytes]] = {
    "error_envelope": ("application/json", b'{"error": {"message": "boom"}}'),
    "no_choices": ("application/json", b'{"choices": []}'),
    "not_an_object": ("application/json", b"[1]"),
    "no_done": ("text/event-stream", b"data: " + json.dumps(_CHUNK).encode() + b"\n\n"),
    "null_error": (
        "text/event-stream",
        b"data: " + json.dumps(_CHUNK).encode() + b"\n\ndata: [DONE]\n\n",
    ),
}


@contextlib.asynccontextmanager
async def _answering(answer: str) -> AsyncIterator[str]:
    """A server whose every completion is ``_ANSWERS[answer]``, with status 200."""
    content_type, body = _ANSWERS[answer]

    async def reply(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", reply)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("answer", "stream", "error"),
    [
        ("error_envelope", False, "bad_response"),
        ("no_choices", False, "no_tokens"),
        ("not_an_object", False, "bad_response"),
        ("no_done", True, "stream_broken"),
        ("null_error", True, None),  # "error": null in a chunk is no error
    ],
)
async def test_a_200_that_is_no_completion_is_an_error(
    answer: str, stream: bool, error: str | None
) -> None:
    """Each was counted as completed (and the run exited 0)."""
    async with _answering(answer) as url:
        load = await run_load(small_gsp(2), LoadSpec(urls=(url,), stream=stream))
    assert [r.error for r in load.results] == [error, error]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("proxy", [PASSTHROUGH, PROTOCOL_PASSTHROUGH])
async def test_reference_passthrough_relays_round_robin(
    engines: list[FakeEngine], tmp_path: Path, stream: bool, proxy: str
) -> None:
    """bench-peers' reference proxies: a child process, round robin, bodies and streams intact."""
    fleet = FleetHandle(("e0", "e1"), tuple(e.url for e in engines), None, "model")  # type: ignore[arg-type]
    procs = ProcessSet(tmp_path)
    try:
        router = await start_router(
            procs, RouterSpec(proxy, "round_robin"), PeerPaths(None, None), fleet
        )
        assert router.url is not None
        assert router.child is not None
        spec = LoadSpec(urls=(router.url,), stream=stream, concurrency=2)
        load = await run_load(small_gsp(8), spec)
        assert [r.ok for r in load.results] == [True] * 8
        assert all(r.output_tokens == 4 for r in load.results)
        assert [e.requests for e in engines] == [4, 4]
        received = sorted(json.dumps(b, sort_keys=True) for e in engines for b in e.bodies)
        sent = [json.loads(p.body) for p in prepare_requests(small_gsp(8), spec)]
        assert received == sorted(json.dumps(b, sort_keys=True) for b in sent)
    finally:
        procs.stop_all()
    assert not router.child.alive()


async def test_protocol_passthrough_answers_502_for_a_dead_upstream(
    engines: list[FakeEngine], tmp_path: Path
) -> None:
    """An upstream that refuses connections gets the client a 502, not a hang, and the proxy
    goes on serving through the live one."""
    dead = f"http://127.0.0.1:{free_port()}"
    fleet = FleetHandle(("e0", "dead"), (engines[0].url, dead), None, "model")  # type: ignore[arg-type]
    procs = ProcessSet(tmp_path)
    try:
        spec = RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin")
        router = await start_router(procs, spec, PeerPaths(None, None), fleet)
        assert router.url is not None
        load = await run_load(small_gsp(4), LoadSpec(urls=(router.url,), concurrency=1))
        assert [r.ok for r in load.results] == [True, False, True, False]
        assert [r.error for r in load.results][1::2] == ["http_502", "http_502"]
        assert engines[0].requests == 2
    finally:
        procs.stop_all()


async def test_protocol_passthrough_keeps_the_method_and_the_reason_phrase(
    engines: list[FakeEngine], tmp_path: Path
) -> None:
    """A GET stays a GET (the engine serves ``GET /metrics`` only), and an answer keeps its
    status with the standard reason phrase (404 Not Found, not "404 OK")."""
    fleet = FleetHandle(("e0",), (engines[0].url,), None, "model")  # type: ignore[arg-type]
    procs = ProcessSet(tmp_path)
    try:
        spec = RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin")
        router = await start_router(procs, spec, PeerPaths(None, None), fleet)
        assert router.url is not None
        async with aiohttp.ClientSession() as session:
            async with session.get(engines[0].url + "/metrics") as resp:
                direct = await resp.text()
            async with session.get(router.url + "/metrics") as resp:
                assert (resp.status, resp.reason) == (200, "OK")
                assert await resp.text() == direct
            async with session.get(router.url + "/nowhere") as resp:
                assert (resp.status, resp.reason) == (404, "Not Found")
            async with session.post(router.url + "/metrics") as resp:
                assert (resp.status, resp.reason) == (405, "Method Not Allowed")
    finally:
        procs.stop_all()


@pytest.mark.slow
async def test_a_router_whose_port_was_taken_is_started_again_elsewhere(
    engines: list[FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``free_port`` only says a port was free when asked: if something binds it before the
    router does, the start is retried on another port instead of failing the whole run."""
    fleet = FleetHandle(("e0",), (engines[0].url,), None, "model")  # type: ignore[arg-type]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken, free_port()])
        monkeypatch.setattr(peers_routers, "free_port", lambda: next(ports))
        procs = ProcessSet(tmp_path)
        try:
            spec = RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin")
            router = await start_router(procs, spec, PeerPaths(None, None), fleet)
            assert router.url is not None
            assert not router.url.endswith(f":{taken}")
            load = await run_load(small_gsp(2), LoadSpec(urls=(router.url,), concurrency=1))
            assert [r.ok for r in load.results] == [True, True]
            assert len(procs.children) == 1  # the failed start was stopped and forgotten
        finally:
            procs.stop_all()
