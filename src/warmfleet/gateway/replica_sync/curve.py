"""CURVE authentication and encryption of the replicas' sync sockets
(``spec.replicaSync.curveSecretEnv``; docs/replicas.md, "Who may talk to a replica").

Every replica of one gateway fleet holds the same CURVE secret key (ZeroMQ's CurveZMQ: X25519
keys; each connection is authenticated and encrypted). A replica's PUB and catch-up ROUTER
sockets are CURVE servers with that key; its SUB and catch-up DEALER sockets are CURVE clients
whose own key, and the server key they expect, are that same key's. A ZAP handler (pyzmq's
``zmq.auth.Authenticator``, bound before any server socket so that no handshake goes
unchecked) admits a client only if its public key is the fleet's: whoever lacks the secret can
neither read the replicas' notes nor teach a replica a routing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.auth import Authenticator

from warmfleet.core.errors import ConfigError

ZAP_DOMAIN = b"warmfleet-sync"
_Z85_KEY_CHARS = 40  # a 32-byte key in Z85
_POLLIN = int(zmq.POLLIN)


@dataclass(frozen=True)
class CurveKey:
    """The fleet's CURVE keypair, Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"CurveKey(public={self.public.decode()!r})"

    @classmethod
    def from_secret(cls, text: str, source: str) -> CurveKey:
        """The keypair of a Z85 secret key; ``ConfigError`` naming ``source`` otherwise."""
        raw = text.strip().encode("utf-8", "surrogateescape")
        if len(raw) != _Z85_KEY_CHARS or not raw.isascii():
            raise ConfigError(
                f"{source}: not a CURVE secret key ({_Z85_KEY_CHARS} Z85 characters; "
                "`warmfleet sync-key` prints a new one)"
            )
        try:
            public = zmq.curve_public(raw)
        except (zmq.ZMQError, ValueError) as err:
            raise ConfigError(f"{source}: not a CURVE secret key (Z85): {err}") from err
        return cls(public, raw)


def new_secret() -> str:
    """A fresh CURVE secret key, Z85."""
    return zmq.curve_keypair()[1].decode("ascii")


class _FleetKeyOnly:
    """ZAP credentials check: the client's key is the fleet's."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:  # noqa: ARG002 (pyzmq calls it so)
        return hmac.compare_digest(key, self.public)


_FAILED_HANDSHAKES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class ZapGuard:
    """One replica's CURVE setup, in its ZeroMQ context: the ZAP handler, bound when made
    (before any server socket, so no handshake goes unchecked); ``serve_as`` and ``connect_as``
    make a socket a server (its failed handshakes monitored) or a client with the fleet's key;
    ``serve`` answers the ZAP requests and counts each refused handshake with ``on_refused()``
    (another key, none, or a client key that is not the fleet's), a task of the replica's
    TaskGroup; ``close`` closes the handler and the monitors."""

    def __init__(
        self, ctx: zmq.Context[Any], key: CurveKey, on_refused: Callable[[], None]
    ) -> None:
        self._ctx = ctx
        self._key = key
        self._on_refused = on_refused
        self._monitors: list[zmq.Socket[bytes]] = []
        self._auth = Authenticator(ctx, log=logging.getLogger(__name__))
        # pyzmq looks the check up by the ZAP domain the server sockets set
        self._auth.configure_curve_callback(ZAP_DOMAIN.decode(), _FleetKeyOnly(key.public))
        self._auth.start()  # binds inproc://zeromq.zap.01

    def serve_as(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` (before it binds) a CURVE server with the fleet's key, its failed
        handshakes counted."""
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._key.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self._key.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        address = f"inproc://warmfleet-sync-monitor-{id(sock)}"
        sock.monitor(address, _FAILED_HANDSHAKES)
        monitor: zmq.Socket[bytes] = zmq.Socket(self._ctx, zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        self._monitors.append(monitor)

    def connect_as(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` (before it connects) a CURVE client holding the fleet's key and
        expecting it of the server."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self._key.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self._key.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._key.secret)

    async def serve(self) -> None:
        """Answer ZAP requests and read the monitors until cancelled (a handshake waits for
        its ZAP answer)."""
        zap = self._auth.zap_socket
        poller = zmq.asyncio.Poller()
        for sock in (zap, *self._monitors):
            poller.register(sock, zmq.POLLIN)
        while True:
            for sock, _event in await poller.poll():
                while int(sock.getsockopt(zmq.EVENTS)) & _POLLIN:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                    if sock is zap:
                        await self._auth.handle_zap_message(frames)
                    else:  # one failed handshake (the only events asked for)
                        self._on_refused()

    def close(self) -> None:
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._auth.stop()
