"""Who this replica's peers are (``spec.replicaSync.peers``): a static list, a watched file, or
the ready endpoints of the gateway's own Service (its EndpointSlices, watched by the same code
as the engines' Kubernetes discovery). ``PeerWatch.run`` is a task owned by the sync service; it
calls ``on_peers`` with the full set of sync endpoints (``tcp://host:port``, this replica's own
left out) at every change, the first time as soon as the set is known."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from warmfleet.core.config import StrictModel, load_yaml_text, parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.discovery.kubernetes import service_slice_watch
from warmfleet.gateway.replica_sync.config import (
    FilePeers,
    KubernetesPeers,
    PeerEndpoint,
    Peers,
    StaticPeers,
)
from warmfleet.kube.endpointslices import endpoints_from_slices, instance_id

log = logging.getLogger(__name__)

OnPeers = Callable[[frozenset[str]], None]


class PeerList(StrictModel):
    """The content of a peers file."""

    endpoints: list[PeerEndpoint] = Field(default_factory=list)


def parse_peer_list(data: Any, source: str) -> frozenset[str]:
    if isinstance(data, list) or data is None:
        data = {"endpoints": data or []}
    return frozenset(parse_document(PeerList, data, source).endpoints)


def peers_from_slices(
    slices: Iterable[Mapping[str, Any]], port: str | int, own_id: str
) -> frozenset[str]:
    """The sync endpoints of the Service's ready endpoints, this replica (``own_id``, its pod
    name, however long) left out."""
    found = endpoints_from_slices(slices, port, lambda iid, url: (iid, url), "tcp")
    own = instance_id(own_id)
    return frozenset(url for iid, url in found if iid != own)


class PeerWatch:
    """Follows one ``peers`` source; ``own_endpoint`` and ``own_id`` name this replica (left
    out of every set)."""

    def __init__(self, peers: Peers, own_endpoint: str, own_id: str, on_peers: OnPeers) -> None:
        self.peers = peers
        self.own_endpoint = own_endpoint
        self.own_id = own_id
        self.on_peers = on_peers
        self.current: frozenset[str] | None = None  # None: not known yet
        self.errors = 0

    def publish(self, endpoints: frozenset[str]) -> None:
        endpoints = endpoints - {self.own_endpoint}
        if endpoints != self.current:
            self.current = endpoints
            self.on_peers(endpoints)

    async def run(self) -> None:
        peers = self.peers
        if isinstance(peers, StaticPeers):
            self.publish(frozenset(peers.endpoints))
            return
        if isinstance(peers, FilePeers):
            await self._follow_file(peers)
            return
        await self._follow_service(peers)

    async def _follow_file(self, peers: FilePeers) -> None:
        seen: tuple[int, int] | None = None
        path = Path(peers.path)
        while True:
            try:
                stat = os.stat(path)
                version = (stat.st_mtime_ns, stat.st_size)
                if version != seen:
                    text = path.read_text(encoding="utf-8")
                    self.publish(parse_peer_list(load_yaml_text(text, str(path)), str(path)))
                    seen = version
            except (OSError, UnicodeDecodeError, ConfigError) as err:
                if seen != (-1, -1):
                    self.errors += 1
                    log.warning("replica-sync peers file %s unusable, keeping peers: %s", path, err)
                    seen = (-1, -1)
            await asyncio.sleep(peers.poll_interval_s)

    async def _follow_service(self, peers: KubernetesPeers) -> None:
        def on_change(slices: Iterable[Mapping[str, Any]]) -> None:
            self.publish(peers_from_slices(slices, peers.port, self.own_id))

        def on_error(err: BaseException, first: bool) -> None:
            self.errors += 1
            if first:
                log.error("replica-sync peers from Service %s unavailable: %s", peers.service, err)

        await service_slice_watch(peers, peers.service, on_change, on_error).run()
