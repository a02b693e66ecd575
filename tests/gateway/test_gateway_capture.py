"""Traffic capture (``spec.capture``): off by default, one trace line per answered request off
the request path, a full queue drops and counts, rotation, reload; the privacy test (no marker,
no unsalted hash of one) is in test_gateway_capture_privacy.py."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

import aiohttp
import pytest
import yaml
from gateway_support import MODEL, backends_running, gateway_doc, gateway_running

from support.waiting import wait_until
from warmfleet.api.trace_format import parse_trace, record_line
from warmfleet.core.errors import ConfigError
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.capture_config import CaptureConfig
from warmfleet.gateway.capture_file import (
    Captured,
    CaptureFile,
    RecordMaker,
    WriteResult,
    usage_of,
)
from warmfleet.gateway.config import load_gateway_config, parse_gateway_config
from warmfleet.routing.router import Router

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 80}], "max_tokens": 5}


def doc_with(
    backends: Sequence[Any], capture: dict[str, Any] | None, strategy: str = "prefix_affinity"
) -> dict[str, Any]:
    doc = gateway_doc(backends, strategy={"type": strategy})
    if capture is not None:
        doc["spec"]["capture"] = capture
    return doc


def read(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line]


async def post_many(url: str, count: int, concurrency: int = 8) -> list[int]:
    statuses: list[int] = []
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as client:

        async def one(i: int) -> None:
            body = {**CHAT, "messages": [{"role": "user", "content": f"q{i % 5} " * 60}]}
            async with gate, client.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                statuses.append(resp.status)

        await asyncio.gather(*(one(i) for i in range(count)))
    return statuses


def test_config_is_camel_case_and_errors_name_the_field() -> None:
    doc = {"path": "c.jsonl", "maxBytes": 8192, "keepFiles": 1, "sampleFraction": 0.5}
    config = CaptureConfig.model_validate({**doc, "queueSize": 10})
    assert (config.max_bytes, config.keep_files, config.sample_fraction) == (8192, 1, 0.5)
    gateway = gateway_doc([])
    gateway["spec"]["endpoints"][0]["variants"][0]["instances"] = []
    assert parse_gateway_config(gateway).spec.capture is None  # off by default
    gateway["spec"]["capture"] = {**doc, "sampleFraction": 1.5}
    with pytest.raises(ConfigError, match="sampleFraction"):
        parse_gateway_config(gateway)
    gateway["spec"]["capture"] = {"path": "c.jsonl", "queueSiz": 3}
    with pytest.raises(ConfigError, match="queueSiz"):
        parse_gateway_config(gateway)


def test_usage_is_read_from_the_answer_tail() -> None:
    usage = b'"usage":{"prompt_tokens":40,"completion_tokens":5,'
    details = b'"prompt_tokens_details":{"cached_tokens":32}}}'
    assert usage_of(usage + details) == (40, 5, 32)
    assert usage_of(b'"usage":null}') == (None, None, None)
    assert usage_of(b'"usage":{"prompt_tokens":3') == (None, None, None)  # cut: unknown
    assert usage_of(None) == (None, None, None)


async def test_one_line_per_answered_request_and_it_parses(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    async with backends_running("a", "b") as backends:
        config = parse_gateway_config(doc_with(backends, {"path": str(path)}))
        async with gateway_running(config) as gw:
            async with aiohttp.ClientSession() as client:
                bad = gw.url + "/v1/chat/completions"
                async with client.post(bad, data=b"{not json") as resp:
                    assert resp.status == 400  # refused before routing: no line
                async with client.get(gw.url + "/version") as resp:
                    await resp.read()  # a utility route: no line
            statuses = await post_many(gw.url, 60)
            metrics = gw.gateway.capture.metrics
    assert statuses == [200] * 60
    trace = parse_trace(read(path), str(path))
    assert trace.has_header
    assert trace.header.block_tokens == 128
    assert trace.header.fleet.instances == 2
    assert trace.header.fleet.strategy is not None
    assert trace.header.fleet.strategy["type"] == "prefix_affinity"
    assert len(trace.records) == 60 == metrics.lines.value
    assert metrics.dropped.value == 0
    assert metrics.bytes.value == path.stat().st_size
    record = trace.records[0]
    assert record.status == 200
    assert record.model == MODEL
    assert record.variant == "v1"
    assert record.instance in ("a", "b")
    assert record.reason is not None
    assert len(record.hash_ids) == len("q0 " * 60) // 128 >= 1
    assert record.ttft_ms is not None
    assert record.e2e_ms is not None
    assert record.e2e_ms >= record.ttft_ms
    assert record.tenant is None
    hits = [r for r in trace.records if r.predicted_cached_tokens]
    assert hits
    assert all((r.predicted_cached_tokens or 0) % 128 == 0 for r in hits)


async def test_a_full_queue_drops_and_counts_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_write = CaptureFile.write

    def blocked(self: CaptureFile, items: Sequence[Captured], header: str) -> WriteResult:
        release.wait(30)
        return real_write(self, items, header)

    monkeypatch.setattr(CaptureFile, "write", blocked)
    path = tmp_path / "capture.jsonl"
    async with backends_running("a") as backends:
        doc = doc_with(backends, {"path": str(path), "queueSize": 1})
        async with gateway_running(parse_gateway_config(doc)) as gw:
            t0 = time.perf_counter()
            statuses = await post_many(gw.url, 20, concurrency=1)
            elapsed_s = time.perf_counter() - t0
            metrics = gw.gateway.capture.metrics
            dropped = metrics.dropped.value
            release.set()
            await wait_until(lambda: metrics.lines.value == 2)
    assert statuses == [200] * 20
    assert elapsed_s < 10  # not held by the blocked writer
    assert dropped == 18  # one in the writer's hands, one queued
    assert len(parse_trace(read(path)).records) == 2


def _captured(i: int, t_s: float) -> Captured:
    key = RoutingKey(tuple(range(i, i + 30)), 16, 480, 480, i, output_tokens_hint=8)
    decision = Decision("inst-0", Reason.PREFIX_HIT, predicted_cached_blocks=2)
    return Captured(
        t_s, t_s + 0.01, t_s + 0.1, key, decision, "inst-0", "v1", "s", 200, None, None, "m"
    )


@pytest.mark.parametrize(
    ("tenant", "model", "status", "usage"),
    [
        (None, None, 200, None),
        ("acme", 'm\u00e9-"quoted"', 503, b'"usage":{"completion_tokens":3}'),
        ("t", "x" * 513, 0, b'"usage":{"prompt_tokens_details":{"cached_tokens":16}}'),
    ],
)
def test_the_fast_line_is_record_line_of_the_record(
    tenant: str | None, model: str | None, status: int, usage: bytes | None
) -> None:
    item = _captured(3, 10.0)._replace(tenant=tenant, model=model, status=status, usage=usage)
    maker = RecordMaker()
    record = maker.record(item, 9.5)
    if model is not None and len(model) > 512:
        record["model"] = None  # too long for the format: left out
    line = maker.line(item, 9.5)
    assert line == record_line(record)
    assert maker.line(item, 9.5) == line  # with the block ids' texts memoised


def test_rotation_keeps_files_each_with_a_header_and_its_own_clock(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("an earlier capture\n")
    file = CaptureFile(CaptureConfig(path=str(path), max_bytes=4096, keep_files=2))
    header = '{"warmfleet_trace":1,"block_tokens":16}'
    results = [file.write([_captured(i, 100.0 + i)], header) for i in range(60)]
    file.close()
    assert sum(r.lines for r in results) == 60
    rotations = sum(r.rotations for r in results)
    assert rotations >= 3  # the earlier capture's file, then size
    assert not (tmp_path / "c.jsonl.3").exists()
    for name in ("c.jsonl", "c.jsonl.1", "c.jsonl.2"):
        kept = tmp_path / name
        assert kept.stat().st_size <= 4096
        trace = parse_trace(read(kept), name)
        assert trace.has_header
        assert trace.header.block_tokens == 16
        assert trace.records[0].timestamp == 0.0
        assert trace.records[-1].timestamp > 0.0
    last = parse_trace(read(path)).records[-1]
    assert last.predicted_cached_tokens == 32
    assert last.output_length == 8


def hashes_blocks(router: object) -> bool:
    assert isinstance(router, Router)
    return router.keys.hash_blocks


async def test_a_reload_turns_it_on_moves_it_and_turns_it_off(tmp_path: Path) -> None:
    """round_robin reads no block hashes: its keys carry them only while capturing."""
    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    async with backends_running("a") as backends:
        config_path = tmp_path / "gateway.yaml"
        doc = doc_with(backends, None, "round_robin")
        config_path.write_text(yaml.safe_dump(doc))
        config = load_gateway_config(config_path)
        async with gateway_running(config, config_path=config_path) as gw:
            proxy = gw.gateway.proxy
            variant = gw.gateway.state.endpoint("main").variants["v1"]
            assert proxy.capture is None
            assert not hashes_blocks(variant.router)
            await post_many(gw.url, 2)
            for capture in ({"path": "one.jsonl"}, {"path": str(second)}, None):
                doc = doc_with(backends, capture, "round_robin")
                config_path.write_text(yaml.safe_dump(doc))
                assert gw.gateway.reload() is True
                assert (proxy.capture is None) == (capture is None)
                assert hashes_blocks(variant.router) == (capture is not None)
                await post_many(gw.url, 3)
            lines = gw.gateway.capture.metrics.lines
            await wait_until(lambda: lines.value == 6)
    for path in (first, second):  # the first relative to the document
        records = parse_trace(read(path)).records
        assert len(records) == 3
        assert all(r.hash_ids and r.reason == "round_robin" for r in records)


async def test_sampling_is_deterministic(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    async with backends_running("a") as backends:
        doc = doc_with(backends, {"path": str(path), "sampleFraction": 0.25})
        async with gateway_running(parse_gateway_config(doc)) as gw:
            await post_many(gw.url, 40)
    assert len(parse_trace(read(path)).records) == 10


def test_a_capture_path_that_is_a_directory_is_never_moved(tmp_path: Path) -> None:
    """It was rotated away as an earlier capture: the user's directory renamed to ``.1``."""
    path = tmp_path / "capdir"
    (path / "important").mkdir(parents=True)
    file = CaptureFile(CaptureConfig(path=str(path), max_bytes=4096, keep_files=2))
    result = file.write([_captured(1, 1.0)], '{"warmfleet_trace":1}')
    file.close()
    assert (result.lines, result.failed) == (0, 1)
    assert (path / "important").is_dir()
    assert not (tmp_path / "capdir.1").exists()


class _FullDisk:
    """A capture file's writer whose ``fails_at``-th write lands half its bytes, then fails
    as a full disk does."""

    def __init__(self, real: Any, fails_at: int) -> None:
        self.real, self.left = real, fails_at

    def write(self, data: bytes) -> int:
        self.left -= 1
        if self.left == 0:
            self.real.write(data[: len(data) // 2])
            self.real.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.real.write(data))

    def flush(self) -> None:
        self.real.flush()

    def close(self) -> None:
        self.real.close()


def test_a_full_disk_leaves_whole_lines_only(tmp_path: Path) -> None:
    """A line cut by a full disk made the whole file unreadable as a trace."""
    path = tmp_path / "c.jsonl"
    file = CaptureFile(CaptureConfig(path=str(path), max_bytes=1 << 20, keep_files=2))
    header = '{"warmfleet_trace":1,"block_tokens":16}'
    assert file.write([_captured(i, 100.0 + i) for i in range(3)], header).lines == 3
    file._file = cast("IO[bytes]", _FullDisk(file._file, 2))  # a full disk, by the one way in
    assert file.write([_captured(i, 110.0 + i) for i in range(3)], header).failed == 3
    file.close()
    assert len(parse_trace(read(path)).records) == 3
