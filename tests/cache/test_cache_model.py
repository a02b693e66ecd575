"""Manifests, keys, state machine, transfer helpers, config and URI parsing (pure)."""

from __future__ import annotations

import random

import pytest

from warmfleet.cache.config import load_node_config, parse_size
from warmfleet.cache.manifest import FileEntry, Manifest, ManifestError, SourceKind
from warmfleet.cache.presigned import identity_uri
from warmfleet.cache.state import ArtifactRecord, ArtifactState, StateTransitionError
from warmfleet.cache.transfer import Backoff, RateMeter, ResumeState, TokenBucket, plan_chunks
from warmfleet.cache.uri import parse_uri
from warmfleet.core.clock import ManualClock
from warmfleet.core.errors import BadRequestError, ConfigError


def manifest(etag: str = '"a"', size: int = 10) -> Manifest:
    entry = FileEntry("w.bin", size, "s3key", etag=etag, version_id="v1")
    return Manifest(SourceKind.S3, "s3://b/w.bin", (entry,))


def test_key_is_content_derived() -> None:
    assert manifest().key() == manifest().key()
    assert manifest('"b"').key() != manifest().key()  # changed in place at the same URI
    assert manifest(size=11).key() != manifest().key()
    moved = Manifest(
        SourceKind.S3,
        "s3://b/w.bin",
        (FileEntry("w.bin", 10, "elsewhere", etag='"a"', version_id="v1"),),
    )
    assert moved.key() == manifest().key()  # the locator is not identity


def test_manifest_roundtrip_and_path_safety() -> None:
    m = manifest()
    assert Manifest.from_json(m.to_json()) == m
    for bad in ("../x", "/abs", "a/../../b", "a//b", ".warmfleet-complete.json", ""):
        with pytest.raises(ManifestError):
            Manifest(SourceKind.LOCAL, "file:///x", (FileEntry(bad, 1, "x"),))
    with pytest.raises(ManifestError, match="duplicate"):
        Manifest(SourceKind.LOCAL, "file:///x", (FileEntry("a", 1, "x"), FileEntry("a", 1, "y")))


def test_state_machine() -> None:
    rec = ArtifactRecord("k", "n", "u", 1)
    rec = rec.transition(ArtifactState.DOWNLOADING).transition(ArtifactState.VERIFYING)
    with pytest.raises(StateTransitionError):
        ArtifactRecord("k", "n", "u", 1).transition(ArtifactState.READY)  # never unverified
    failed = rec.transition(ArtifactState.FAILED, "IntegrityError: sha256")
    assert failed.reason.startswith("IntegrityError")
    assert failed.transition(ArtifactState.PENDING).reason == ""
    assert not ArtifactRecord(
        "k", "n", "u", 1, ArtifactState.READY, refs=frozenset({"d"})
    ).evictable
    assert ArtifactRecord.from_json(failed.to_json()) == failed


def test_chunks_and_resume_state() -> None:
    chunks = plan_chunks("f", 25, 10)
    assert [(c.start, c.end) for c in chunks] == [(0, 10), (10, 20), (20, 25)]
    assert plan_chunks("f", 0, 10) == []
    state = ResumeState("key", 10)
    state.mark(chunks[1])
    again = ResumeState.from_json(state.to_json(), key="key", chunk_bytes=10)
    assert again.is_done(chunks[1])
    assert not again.is_done(chunks[0])
    assert again.done_bytes(chunks) == 10
    # progress for another key or chunk size is never reused
    assert not ResumeState.from_json(state.to_json(), key="other", chunk_bytes=10).done
    assert not ResumeState.from_json(state.to_json(), key="key", chunk_bytes=5).done


def test_token_bucket_rate_is_exact_on_average() -> None:
    clock = ManualClock()
    bucket = TokenBucket(clock, rate_bps=1000.0, burst_bytes=100)
    waited = 0.0
    for _ in range(50):
        delay = bucket.reserve(200)
        waited += delay
        clock.advance(delay)
    # 50 * 200 bytes at 1000 B/s with a 100-byte burst -> (10000 - 100) / 1000 s
    assert waited == pytest.approx(9.9, rel=1e-6)


def test_rate_meter_and_eta() -> None:
    clock = ManualClock()
    meter = RateMeter(clock, total_bytes=1000)
    for _ in range(5):
        clock.advance(1.0)
        meter.add(100)
    assert meter.rate_bps() == pytest.approx(100.0)
    assert meter.eta_s() == pytest.approx(5.0)


def test_backoff_bounds() -> None:
    b = Backoff(base_s=0.5, cap_s=4.0)
    rng = random.Random(1)
    for attempt in range(1, 8):
        d = b.delay_s(attempt, rng)
        ceiling = min(4.0, 0.5 * 2 ** (attempt - 1))
        assert ceiling / 2 <= d <= ceiling


def test_config_parsing_and_errors() -> None:
    cfg = load_node_config(
        """
apiVersion: warmfleet.dev/v1alpha1
kind: NodeCacheConfig
spec:
  root: /tmp/x
  capacity: {budget: 2GiB, reserve: 100MB}
  download: {chunk: 4MiB, bandwidthLimit: 1GB}
  artifacts:
    - {type: model, name: m, uri: "hf://org/m", pin: true}
    - {type: image, name: i, ref: "127.0.0.1:5000/x:1"}
"""
    )
    assert cfg.spec.capacity.budget == 2 * 2**30
    assert cfg.spec.download.chunk == 4 * 2**20
    assert cfg.spec.artifacts[1].type == "image"
    with pytest.raises(ConfigError, match=r"spec\.capacity\.budget"):
        load_node_config(
            "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\n"
            "spec: {root: /x, capacity: {budget: lots}}"
        )
    with pytest.raises(ConfigError, match=r"spec\.download\.concurency"):
        load_node_config("spec: {root: /x, capacity: {budget: 1}, download: {concurency: 2}}")
    assert parse_size("1.5KiB") == 1536
    assert cfg.spec.download.lock_wait_timeout_s == 3600.0
    quick = load_node_config(
        "spec: {root: /x, capacity: {budget: 1}, download: {lockWaitTimeoutS: 2}}"
    )
    assert quick.spec.download.lock_wait_timeout_s == 2.0
    with pytest.raises(ConfigError, match=r"spec\.download\.lockWaitTimeoutS"):
        load_node_config("spec: {root: /x, capacity: {budget: 1}, download: {lockWaitTimeoutS: 0}}")


def test_uri_parsing() -> None:
    assert parse_uri("/data/m").kind == SourceKind.LOCAL
    assert parse_uri("s3://bucket/pre/fix/").key == "pre/fix/"
    hf = parse_uri("hf://org/model@abc")
    assert (hf.kind, hf.location, hf.revision) == (SourceKind.HF, "org/model", "abc")
    assert parse_uri("oci://127.0.0.1:5000/img:1").location == "127.0.0.1:5000/img:1"
    with pytest.raises(BadRequestError):
        parse_uri("ftp://x/y")


SIGV4 = (
    "https://b.s3.amazonaws.com/llama/w.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIA%2F20261130%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={date}"
    "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={sig}"
)


def test_identity_uri_drops_what_signs_a_url_and_keeps_what_names_the_object() -> None:
    a = SIGV4.format(date="20261130T000000Z", sig="aa11")
    b = SIGV4.format(date="20261130T060000Z", sig="bb22")
    assert identity_uri(a) == identity_uri(b) == "https://b.s3.amazonaws.com/llama/w.bin"
    v2 = "https://b.s3.amazonaws.com/w.bin?AWSAccessKeyId=AKIA&Expires=1764460800&Signature=x%3D"
    assert identity_uri(v2) == "https://b.s3.amazonaws.com/w.bin"
    gcs = "https://storage.googleapis.com/b/w.bin?x-goog-signature=ab&X-Goog-Date=1&alt=media"
    assert identity_uri(gcs) == "https://storage.googleapis.com/b/w.bin?alt=media"
    sas = "https://acct.blob.core.windows.net/c/w.bin?sv=2022-11-02&se=2026-12-01&sp=r&sr=b&sig=Zz"
    assert identity_uri(sas) == "https://acct.blob.core.windows.net/c/w.bin"
    # Without a signature, the same names are the object's own parameters: kept.
    plain = "https://models.example/get?file=w.bin&expires=never&sp=1&sv=2"
    assert identity_uri(plain) == plain
    for other in ("s3://b/w.bin", "/data/w.bin", "hf://org/m@main", "https://h/w.bin"):
        assert identity_uri(other) == other


def test_the_cache_key_of_a_presigned_url_survives_signing_it_again() -> None:
    def signed(sig: str, etag: str = '"a"') -> Manifest:
        uri = SIGV4.format(date="20261130T000000Z", sig=sig)
        return Manifest(SourceKind.HTTP, uri, (FileEntry("w.bin", 10, uri, etag=etag),))

    assert signed("aa11").key() == signed("bb22").key()
    assert signed("aa11", etag='"b"').key() != signed("aa11").key()  # the object changed
