"""The embedded fleet's discovery files (one per variant, the gateway's ``discovery: {type:
file}``): endpoint ``a--b`` variant ``c`` and endpoint ``a`` variant ``b--c`` once shared
``a--b--c.json``, so one variant would have routed to the other's engines."""

from __future__ import annotations

from pathlib import Path

from warmfleet.local.replicas import instance_file, write_instances


def test_no_two_endpoint_variant_pairs_share_a_discovery_file(tmp_path: Path) -> None:
    first = instance_file(tmp_path, "a--b", "c")
    second = instance_file(tmp_path, "a", "b--c")
    assert first != second
    assert write_instances(first, [{"id": "one", "url": "http://127.0.0.1:1"}])
    assert write_instances(second, [{"id": "two", "url": "http://127.0.0.1:2"}])
    assert "one" in first.read_text(encoding="utf-8")
    assert "two" in second.read_text(encoding="utf-8")
    assert first.is_relative_to(tmp_path / "gateway")
    assert second.is_relative_to(tmp_path / "gateway")
    assert not write_instances(first, [{"id": "one", "url": "http://127.0.0.1:1"}])  # unchanged
