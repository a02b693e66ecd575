"""Kubernetes EndpointSlices -> ready endpoints (pure: no I/O; the gateway's Kubernetes discovery
and the operator's gateway-metrics scrape feed it).

Follows the ``discovery.k8s.io/v1`` semantics a kube-proxy user expects:

- a slice's port is picked by name (the Service port's name) or by number; a slice without it
  contributes nothing;
- an endpoint takes traffic when ``conditions.ready`` is true or absent ("nil means ready");
  a terminating endpoint reports ``ready: false`` and is dropped;
- only the first address of an endpoint is used (they are fungible); it must be of its slice's
  ``addressType`` (an IPv4 or IPv6 address without a zone, or for ``FQDN`` a DNS name), else the
  endpoint is skipped; IPv6 addresses are bracketed;
- the instance id is the backing Pod's name (``targetRef``), so a restarted pod (new name) is a
  new instance with an empty cache, and a pod keeps its id if its slice is split or merged; an
  endpoint without a Pod reference is named after its address and port; an id is at most 63
  characters (``instance_id``: a longer name keeps its first 54 and a hash of the whole, so two
  long names that share their first 63 characters stay two instances);
- an endpoint listed in two slices (a slice being split) is one instance, and so is a pod of a
  dual-stack Service (in an IPv4 and an IPv6 slice). Its URL must not depend on the order the
  slices come in (a re-created slice moves; a new URL under the same id would rebuild the
  instance), so of the ready addresses of a pod the IPv4 one is used, else the IPv6 one, else
  the FQDN, the lowest URL of a family if they differ (a fixed order is what matters; IPv4 comes
  first as the primary family of most dual-stack clusters).

``discovery.k8s.io/v1beta1`` slices (all Kubernetes 1.20 serves) read the same for these rules;
``slice_version`` picks the version from what the server's API discovery says it serves.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_GROUP = "discovery.k8s.io"
SLICE_VERSIONS = ("v1", "v1beta1")  # preferred first
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_ID_CHARS = 63  # an instance id (``gateway.config.Name``)
_ID_HASH_BYTES = 4  # 8 hex digits after the kept part of a longer name
_ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")  # preferred first (see above)
_DNS_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


def slice_port(slice_obj: Mapping[str, Any], port: str | int) -> int | None:
    """The number of ``port`` (a name or a number) in a slice, or ``None``."""
    ports = slice_obj.get("ports")
    for entry in ports if isinstance(ports, list) else ():
        if not isinstance(entry, Mapping):
            continue
        number = entry.get("port")
        if not isinstance(number, int):
            continue
        if (isinstance(port, int) and number == port) or (
            isinstance(port, str) and entry.get("name") == port
        ):
            return number
    return None


def is_ready(endpoint: Mapping[str, Any]) -> bool:
    conditions = endpoint.get("conditions")
    if not isinstance(conditions, Mapping):
        return True
    return conditions.get("ready") is not False


def _host(address: str, address_type: str) -> str | None:
    """The URL host for ``address`` of ``address_type``, ``None`` if it is not one."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if address_type == "FQDN":
        return address if ip is None and _DNS_NAME.fullmatch(address) else None
    if isinstance(ip, ipaddress.IPv4Address) and address_type == "IPv4":
        return address
    if isinstance(ip, ipaddress.IPv6Address) and address_type == "IPv6" and not ip.scope_id:
        return f"[{address}]"
    return None


def instance_id(name: str) -> str:
    """The instance id of a pod (or address) ``name``: itself up to ``MAX_ID_CHARS``; past it,
    its first characters, ``-`` and 8 hex digits of its BLAKE2b digest (the same in every
    replica and process; a name cut short instead would give two pods one id, and one of them
    no traffic)."""
    if len(name) <= MAX_ID_CHARS:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=_ID_HASH_BYTES).hexdigest()
    return f"{name[: MAX_ID_CHARS - 1 - len(digest)]}-{digest}"


def _instance_id(endpoint: Mapping[str, Any], address: str, number: int) -> str:
    ref = endpoint.get("targetRef")
    if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and isinstance(ref.get("name"), str):
        return instance_id(str(ref["name"]))
    return instance_id(_ID_UNSAFE.sub("-", f"{address}-{number}").strip("-."))


def _ready_urls(
    slice_obj: Mapping[str, Any], port: str | int, scheme: str
) -> Iterator[tuple[str, tuple[int, str]]]:
    """(instance id, (family rank, URL)) for each ready endpoint of one slice."""
    address_type = slice_obj.get("addressType", "IPv4")
    number = slice_port(slice_obj, port)
    if number is None or address_type not in _ADDRESS_TYPES:
        return
    rank = _ADDRESS_TYPES.index(address_type)
    endpoints = slice_obj.get("endpoints")
    for endpoint in endpoints if isinstance(endpoints, list) else ():
        if not isinstance(endpoint, Mapping) or not is_ready(endpoint):
            continue
        addresses = endpoint.get("addresses")
        address = addresses[0] if isinstance(addresses, list) and addresses else None
        host = _host(address, address_type) if isinstance(address, str) else None
        if address is not None and host is not None:
            yield _instance_id(endpoint, address, number), (rank, f"{scheme}://{host}:{number}")


def endpoints_from_slices(
    slices: Iterable[Mapping[str, Any]],
    port: str | int,
    make: Callable[[str, str], T],
    scheme: str = "http",
) -> list[T]:
    """The ready endpoints behind a Service's slices, sorted by id, each built by
    ``make(id, url)``; the same whatever the order of the slices (an instance listed in several
    takes its IPv4 URL, else IPv6, else FQDN). A URL ``make`` refuses with ``ValueError`` (an
    address no URL can carry) is skipped: the instance's next one is tried."""
    candidates: dict[str, set[tuple[int, str]]] = {}
    for slice_obj in slices:
        for iid, candidate in _ready_urls(slice_obj, port, scheme):
            candidates.setdefault(iid, set()).add(candidate)
    found: list[T] = []
    for iid in sorted(candidates):
        for _rank, url in sorted(candidates[iid]):
            try:
                found.append(make(iid, url))
            except ValueError:  # an address no URL can carry: try the next
                continue
            break
    return found


def belongs_to(slice_obj: Mapping[str, Any], service: str) -> bool:
    """Whether a slice is one of ``service``'s (checked here as well: not every API server, or
    API emulator, applies label selectors)."""
    meta = slice_obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(SERVICE_NAME_LABEL) == service


def served_versions(group_doc: Mapping[str, Any]) -> list[str]:
    """The versions an API group document (``GET /apis/<group>``) lists, preferred first."""
    versions = group_doc.get("versions")
    found = [
        str(v["version"])
        for v in (versions if isinstance(versions, list) else ())
        if isinstance(v, Mapping) and isinstance(v.get("version"), str)
    ]
    preferred = group_doc.get("preferredVersion")
    first = preferred.get("version") if isinstance(preferred, Mapping) else None
    return sorted(found, key=lambda v: v != first)


def slice_version(served: Iterable[str]) -> str:
    """``v1`` when served, else ``v1beta1``; ``ValueError`` if the server serves neither."""
    have = set(served)
    for version in SLICE_VERSIONS:
        if version in have:
            return version
    raise ValueError(f"the API server serves no EndpointSlice version we read ({sorted(have)})")
