"""edge.free_port: picks below the kernel's ephemeral range, where no loopback connection's
source port can take the port before its server binds it (CI once failed on a gateway's
listen port, taken that way)."""

from __future__ import annotations

import socket

import pytest

from warmfleet import edge


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = edge.ephemeral_port_range()
    for _ in range(50):
        port = edge.free_port()
        if low - 20_000 >= 1_000:
            assert 20_000 <= port < min(low, 30_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Picks confined to a held port and a free one next to it: only the free one comes."""
    for base in range(20_000, 29_998, 7):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
            try:
                held.bind(("127.0.0.1", base))
            except OSError:
                continue
            held.listen()
            if not edge._bindable("127.0.0.1", base + 1):
                continue
            monkeypatch.setattr(edge, "_PICK_FIRST", base)
            monkeypatch.setattr(edge, "_PICK_END", base + 2)
            monkeypatch.setattr(edge, "_PICK_MIN_SPAN", 2)
            assert {edge.free_port() for _ in range(20)} == {base + 1}
            return
    pytest.fail("no held port with a free neighbour in 20000-29999")


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = edge.ephemeral_port_range()
    monkeypatch.setattr(edge, "ephemeral_port_range", lambda: (20_500, 60_999))
    assert low <= edge.free_port() <= high  # the port-0 pick, from the kernel's real range
