"""Acceptance 5: >= 1,000 malformed requests each get a 4xx JSON error; the gateway process stays
up and its memory stays bounded."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from gateway_process_support import GatewayProcess, ThreadedGateway
from gateway_support import MODEL, gateway_doc, gateway_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_BODY_BYTES = 4096
BATCH = 10  # requests per hypothesis example (per-example overhead dominates otherwise)
EXAMPLES = 101

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
GOOD_MESSAGES = [{"role": "user", "content": "hi"}]


def _valid_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"] for m in value)
    )


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of a request that must be refused with a 4xx."""
    chat = "/v1/chat/completions"
    kind = draw(st.integers(0, 11))
    headers = {"Content-Type": "application/json"}
    path = draw(st.sampled_from([chat, "/v1/completions"]))
    if kind == 0:  # random bytes (almost never JSON; never a valid request)
        body = draw(st.binary(max_size=200))
        if body.strip().startswith(b"{"):
            body = b"\xff" + body
    elif kind == 1:  # valid JSON that is not an object
        body = _dump(draw(json_values.filter(lambda v: not isinstance(v, dict))))
    elif kind == 2:  # an object without a usable model
        obj = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
        obj["model"] = draw(scalars.filter(lambda m: not isinstance(m, str) or not m))
        body = _dump(obj)
    elif kind == 3:  # chat with broken messages
        path = chat
        messages = draw(json_values.filter(lambda v: not _valid_messages(v)))
        body = _dump({"model": MODEL, "messages": messages})
    elif kind == 4:  # completions with a broken prompt
        path = "/v1/completions"
        prompt: object = draw(
            st.sampled_from(
                [None, {}, [], [[]], [-1], [1.5], [True], [["a"]], ["a", 1], 3, [[1], "a"]]
            )
        )
        body = _dump({"model": MODEL, "prompt": prompt})
    elif kind == 5:  # wrong types for stream / max_tokens
        field, value = draw(
            st.sampled_from(
                [("stream", "yes"), ("stream", 1), ("max_tokens", -1), ("max_tokens", "9")]
            )
        )
        body = _dump({"model": MODEL, "messages": GOOD_MESSAGES, "prompt": "x", field: value})
    elif kind == 6:  # invalid UTF-8 inside otherwise plausible JSON
        junk = draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        )
        body = (
            b'{"model": "'
            + MODEL.encode()
            + b'", "messages": [{"role": "user", "content": "'
            + junk
            + b'"}]}'
        )
    elif kind == 7:  # truncated JSON
        full = _dump({"model": MODEL, "messages": GOOD_MESSAGES, "prompt": "p"})
        body = full[: draw(st.integers(0, len(full) - 1))]
    elif kind == 8:  # unknown model, or a well-formed body for an unknown variant
        if draw(st.booleans()):
            body = _dump(
                {
                    "model": "no-such-" + draw(st.text(max_size=6)),
                    "messages": GOOD_MESSAGES,
                    "prompt": "p",
                }
            )
        else:
            body = _dump({"model": MODEL, "messages": GOOD_MESSAGES, "prompt": "p"})
            headers["x-warmfleet-variant"] = "missing-" + draw(st.text("abc", max_size=4))
    elif kind == 9:  # over the size limit
        body = _dump({"model": MODEL, "messages": GOOD_MESSAGES, "pad": "x" * MAX_BODY_BYTES})
    elif kind == 10:  # deeply nested or huge-number JSON
        depth = draw(st.integers(2000, 100000))
        body = draw(st.sampled_from([b"[" * depth, b'{"a":' * min(depth, 1300), b"1" * 5000]))[
            :MAX_BODY_BYTES
        ]
    else:  # bad tenant header, or an invocation on an unknown endpoint
        if draw(st.booleans()):
            body = _dump({"model": MODEL, "messages": GOOD_MESSAGES, "prompt": "p"})
            headers["x-prefix-aware-id"] = draw(
                st.sampled_from(["", "x" * 65, "caf\u00e9", "a\tb"])
            )
        else:
            path = (
                "/endpoints/nope-" + draw(st.text("xyz", min_size=1, max_size=4)) + "/invocations"
            )
            body = draw(st.binary(max_size=64))
    return path, body, headers


def _request(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("Content-Type", "")
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
        return resp.status, ctype, data
    except (http.client.HTTPException, ConnectionError):
        conn.close()
        raise


def _check(status: int, ctype: str, data: bytes) -> None:
    assert 400 <= status < 500, (status, data[:200])
    assert ctype.startswith("application/json"), ctype
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status


@pytest.mark.slow
@pytest.mark.e2e
def test_malformed_requests_get_4xx_json(tmp_path: Path) -> None:
    with ThreadedGateway(None, ["a", "b"]) as fleet:
        doc = gateway_doc(fleet.backends, limits={"max_body_bytes": MAX_BODY_BYTES})
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path, module=True) as gw:
            split = urlsplit(gw.url)
            assert split.hostname is not None
            conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
            seen: list[tuple[str, bytes, dict[str, str]]] = []

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=[
                    HealthCheck.too_slow,
                    HealthCheck.filter_too_much,
                    HealthCheck.data_too_large,
                ],
            )
            @given(st.lists(malformed(), min_size=BATCH, max_size=BATCH))
            def one(cases: list[tuple[str, bytes, dict[str, str]]]) -> None:
                for case in cases:
                    _check(*_request(conn, *case))
                    seen.append(case)

            one()
            assert len(seen) >= 1000
            rss_mid = gw.rss_bytes()
            for case in seen:  # replay: memory must not keep growing
                _check(*_request(conn, *case))
            rss_end = gw.rss_bytes()
            assert gw.proc is not None
            assert gw.proc.poll() is None  # still up
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=_dump({"model": MODEL, "messages": GOOD_MESSAGES}),
            )
            ok = conn.getresponse()
            assert ok.status == 200  # and still serving
            ok.read()
            conn.close()
            assert rss_end - rss_mid < 16 << 20, (rss_mid, rss_end)
            assert "Traceback" not in gw.stderr()
        assert sum(b.stats.requests for b in fleet.backends) == 1  # nothing malformed leaked


LARGE_BYTES = 7_900_000  # under the default 8 MiB limit


@st.composite
def large_malformed(draw: st.DrawFn) -> bytes:
    """A body of up to 7.9 MB that must be refused with a 4xx."""
    size = draw(st.integers(1 << 20, LARGE_BYTES))
    kind = draw(st.integers(0, 4))
    if kind == 0:  # bytes that are not JSON
        pattern = draw(st.binary(min_size=1, max_size=64).filter(lambda b: b[:1] != b"{"))
        return (b"\xff" + pattern * (size // len(pattern) + 1))[:size]
    if kind == 1:  # a large chat cut short
        full = _dump({"model": MODEL, "messages": [{"role": "user", "content": "x" * size}]})
        return full[: draw(st.integers(1, len(full) - 1))]
    if kind == 2:  # nested past any parser's depth
        return draw(st.sampled_from([b"[", b'{"a":'])) * (size // 5)
    if kind == 3:  # invalid UTF-8 at the end of a large string
        return b'{"model": "%s", "prompt": "%s\xff"}' % (MODEL.encode(), b"p" * size)
    pad = {"role": "user", "content": "y" * size}  # large and well-formed, unknown model
    return _dump({"model": "no-such-model", "messages": [pad]})


@pytest.mark.slow
@pytest.mark.e2e
def test_large_malformed_bodies_on_fresh_connections_get_4xx_json(tmp_path: Path) -> None:
    with ThreadedGateway(None, ["a"]) as fleet:
        doc = gateway_doc(fleet.backends)
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path, module=True) as gw:
            split = urlsplit(gw.url)
            sent: list[int] = []
            rss_start = gw.rss_bytes()

            @settings(max_examples=40, deadline=None, database=None)
            @given(large_malformed())
            def one(body: bytes) -> None:
                assert split.hostname is not None
                conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
                try:  # a fresh connection each time
                    _check(*_request(conn, "/v1/chat/completions", body, {}))
                finally:
                    conn.close()
                sent.append(len(body))

            one()
            assert len(sent) >= 40
            assert sum(sent) > 40 << 20  # hypothesis leans to small sizes: ~80 MB in all
            assert gw.rss_bytes() - rss_start < 100 << 20, (rss_start, gw.rss_bytes())
            assert "Traceback" not in gw.stderr()
        assert sum(b.stats.requests for b in fleet.backends) == 0
