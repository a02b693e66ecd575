"""The local fleet's origin (product code, ``warmfleet.local.origin``): validators, ranges,
``If-Match``, the bandwidth cap, and ````origin_proc``'s command line."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.origin import ServerThread
from warmfleet.local.origin import Blob, Origin

DATA = bytes(range(256)) * 4096  # 1 MiB


def _get(
    url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), b""


def test_serves_files_with_validators_ranges_and_if_match(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(DATA)
    origin = Origin()
    origin.put("w.bin", Blob(path=path))
    with ServerThread(origin.app) as server:
        url = f"{server.url}/files/w.bin"
        status, headers, body = _get(url)
        assert (status, body) == (200, DATA)
        digest = base64.b64encode(hashlib.sha256(DATA).digest()).decode()
        assert headers["Repr-Digest"] == f"sha-256=:{digest}:"
        assert headers["Accept-Ranges"] == "bytes"
        etag = headers["ETag"]
        status, headers, body = _get(url, {"Range": "bytes=10-19", "If-Match": etag})
        assert (status, body) == (206, DATA[10:20])
        assert headers["Content-Range"] == f"bytes 10-19/{len(DATA)}"
        assert _get(url, {"Range": "bytes=-5"})[2] == DATA[-5:]
        assert _get(url, {"If-Match": '"other"'})[0] == 412
        assert _get(url, {"Range": f"bytes={len(DATA)}-"})[0] == 416
        assert _get(url, method="HEAD")[1]["Content-Length"] == str(len(DATA))
        assert _get(f"{server.url}/files/missing.bin")[0] == 404
    assert origin.bytes_served == len(DATA) + 10 + 5


def test_throttle_caps_the_bandwidth() -> None:
    origin = Origin(throttle_bps=2 * len(DATA))
    origin.put("w.bin", Blob(data=DATA * 2))
    with ServerThread(origin.app) as server:
        started = time.monotonic()
        assert _get(f"{server.url}/files/w.bin")[2] == DATA * 2
        assert time.monotonic() - started > 0.4  # 2 MiB at 2 MiB/s, after the first burst


def test_the_product_origin_injects_no_faults() -> None:
    """Fault injection belongs to the test harness (tests/harness/origin.py), not the product."""
    assert {f.name for f in dataclasses.fields(Blob)} == {"data", "path", "mtime_s"}
    assert not [name for name in vars(Origin) if "fault" in name or "flip" in name]


def test_origin_proc_without_its_directory_is_one_line_and_fails(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "warmfleet.local.origin_proc", "--dir", str(tmp_path / "no")]
    argv += ["--ready-file", str(tmp_path / "ready.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "no such directory" in done.stderr
