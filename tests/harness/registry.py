"""Start Debian's ``docker-registry`` on 127.0.0.1 and push tiny OCI images to it.

Images are built in Python: a gzip'd tar layer, a config blob and an OCI image manifest (and
optionally an OCI image index over two platforms), uploaded through the distribution API's
monolithic blob upload (POST, then PUT ``?digest=``) and ``PUT /v2/<name>/manifests/<ref>``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet.agent.oci import OCI_INDEX, OCI_MANIFEST, sha256_digest
from warmfleet.bench.live_procs import free_port

REGISTRY_BIN = "docker-registry"


def ensure_registry_installed() -> str | None:
    """Path of the registry binary, installing the Debian package if needed; None if not."""
    found = shutil.which(REGISTRY_BIN)
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        return None
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    install = [apt, "install", "-y", REGISTRY_BIN]
    for steps in ([install], [[apt, "update"], install]):
        for cmd in steps:
            subprocess.run(cmd, check=False, capture_output=True, timeout=600, env=env)
        found = shutil.which(REGISTRY_BIN)
        if found:
            return found
    return None


@contextlib.contextmanager
def run_registry(workdir: Path, binary: str) -> Iterator[str]:
    """Yield ``127.0.0.1:<port>`` of a fresh registry storing under ``workdir``."""
    port = free_port()
    config = workdir / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: error, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: {workdir / 'data'}}}, "
        "delete: {enabled: true}}\n"
        f"http: {{addr: '127.0.0.1:{port}', secret: warmfleet-test}}\n"
    )
    log = (workdir / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v2/", proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"registry exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("registry did not become ready")


def _request(
    method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, dict(resp.headers)


def push_blob(registry: str, repo: str, data: bytes) -> str:
    digest = sha256_digest(data)
    base = f"http://{registry}/v2/{repo}/blobs"
    _, headers = _request("POST", f"{base}/uploads/")
    location = headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    _request(
        "PUT",
        f"{location}{sep}digest={digest}",
        data,
        {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
    )
    return digest


def layer_tar_gz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


@dataclass(frozen=True)
class PushedImage:
    ref: str  # registry/repo:tag
    digest: str  # digest of what the tag points to (index or manifest)
    manifest_digests: dict[str, str]  # platform -> image manifest digest
    blob_bytes: int


def _descriptor(registry: str, repo: str, media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": push_blob(registry, repo, blob), "size": len(blob)}


def _push_manifest(registry: str, repo: str, ref: str, body: bytes, media_type: str) -> None:
    url = f"http://{registry}/v2/{repo}/manifests/{ref}"
    _request("PUT", url, body, {"Content-Type": media_type})


def _platform_manifest(
    registry: str, repo: str, plat: str, layers: list[dict[str, bytes]]
) -> tuple[bytes, int]:
    """Push one platform's layers and config; return its manifest and the bytes pushed."""
    os_name, arch = plat.split("/")[:2]
    blobs = [
        layer_tar_gz({**files, f"platform-{i}": plat.encode()}) for i, files in enumerate(layers)
    ]
    config_doc = {
        "architecture": arch,
        "os": os_name,
        "rootfs": {"type": "layers", "diff_ids": []},
        "config": {},
    }
    config = json.dumps(config_doc, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": _descriptor(registry, repo, "application/vnd.oci.image.config.v1+json", config),
        "layers": [
            _descriptor(registry, repo, "application/vnd.oci.image.layer.v1.tar+gzip", blob)
            for blob in blobs
        ],
    }
    pushed = sum(len(blob) for blob in blobs) + len(config)
    return json.dumps(manifest, sort_keys=True).encode(), pushed


def push_image(
    registry: str,
    *,
    repo: str,
    tag: str,
    layers: list[dict[str, bytes]],
    platforms: tuple[str, ...] = ("linux/amd64",),
    index: bool = False,
) -> PushedImage:
    """Push one image per platform (an OCI index over them when ``index``)."""
    digests: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    total = 0
    for plat in platforms:
        body, pushed = _platform_manifest(registry, repo, plat, layers)
        total += pushed
        digest = digests[plat] = sha256_digest(body)
        _push_manifest(registry, repo, digest if index else tag, body, OCI_MANIFEST)
        os_name, arch = plat.split("/")[:2]
        entries.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": len(body),
                "platform": {"os": os_name, "architecture": arch},
            }
        )
    top = digests[platforms[0]]
    if index:
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        body = json.dumps(doc, sort_keys=True).encode()
        _push_manifest(registry, repo, tag, body, OCI_INDEX)
        top = sha256_digest(body)
    return PushedImage(f"{registry}/{repo}:{tag}", top, digests, total)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Stop a child we started, by PID: SIGTERM, then SIGKILL if it outlives ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
