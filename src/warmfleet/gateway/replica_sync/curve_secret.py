"""The fleet's CURVE key from a Kubernetes Secret (``spec.replicaSync.curveSecret``), made by the
first replica that finds none (docs/replicas.md, "Who may talk to a replica").

At start, before its sockets open, a replica reads the Secret of its namespace. When it is
missing and ``create`` is set, the replica creates it with a new key; two replicas that start
together both try, the API server takes one create and refuses the other (409), and the
refused one reads the winner's: every replica ends with the same key, with no leader and no
step for the user. Anything else fails the start with one line naming the field: the pod
restarts and never syncs unauthenticated. What the API server refused or did not answer (no
access, no Secret and ``create`` off, no such entry) is a ``KubeAccessError``; an entry that is
no key is a ``ConfigError`` (``warmfleet serve`` calls only the latter an invalid config).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import aiohttp

from warmfleet.api.names import LABEL_MANAGED_BY, MANAGER
from warmfleet.gateway.replica_sync.config import CurveSecretRef, ReplicaSyncConfig
from warmfleet.gateway.replica_sync.curve import CurveKey, new_secret
from warmfleet.kube.access import KubeAccess, KubeAccessError, json_or_raise, read_own

FIELD = "spec.replicaSync.curveSecret"
_NOT_FOUND, _CONFLICT = 404, 409
_MADE = (200, 201, 202)  # a create's success (the API conventions allow all three)
_LABELS = {LABEL_MANAGED_BY: MANAGER, "app.kubernetes.io/component": "gateway"}


async def fleet_curve_key(config: ReplicaSyncConfig) -> CurveKey | None:
    """The fleet's keypair: from ``curve_secret`` (read, or created), else ``curve_secret_env``
    (``ReplicaSyncConfig.curve_key``), else None (no authentication)."""
    ref = config.curve_secret
    if ref is None:
        return config.curve_key()
    try:
        namespace = ref.namespace or read_own(ref.namespace_path, "namespace")
        access = KubeAccess(ref)
        async with access.session() as http:
            text = await _read_or_create(http, access, ref, namespace)
    except (KubeAccessError, aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise KubeAccessError(f"{FIELD}: {err or type(err).__name__}") from err
    return CurveKey.from_secret(text, f"{FIELD}: Secret {namespace}/{ref.name} {ref.key!r}")


async def _read_or_create(
    http: aiohttp.ClientSession, access: KubeAccess, ref: CurveSecretRef, namespace: str
) -> str:
    """The key's text: the Secret's entry, else the new key of the Secret this call made."""
    url = f"{access.api_server()}/api/v1/namespaces/{namespace}/secrets"
    timeout = access.timeout()
    for _attempt in range(2):  # a create refused as a conflict: another replica's is there
        headers = access.auth_headers()
        async with http.get(f"{url}/{ref.name}", headers=headers, timeout=timeout) as got:
            if got.status != _NOT_FOUND:
                return _entry(await json_or_raise(got), ref)
        if not ref.create:
            raise KubeAccessError(f"Secret {namespace}/{ref.name} not found (create is false)")
        secret = new_secret()
        body = _secret(ref, secret)
        async with http.post(url, json=body, headers=headers, timeout=timeout) as made:
            if made.status in _MADE:
                return secret
            if made.status != _CONFLICT:
                text = (await made.text(errors="replace"))[:200]
                raise KubeAccessError(f"POST {url}: HTTP {made.status}: {text}")
    raise KubeAccessError(f"Secret {namespace}/{ref.name}: created by another, then not found")


def _secret(ref: CurveSecretRef, secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ref.name, "labels": _LABELS},
        "type": "Opaque",
        "data": {ref.key: base64.b64encode(secret.encode("ascii")).decode("ascii")},
    }


def _entry(secret: dict[str, Any], ref: CurveSecretRef) -> str:
    """The entry ``ref.key`` of a Secret object, decoded (a ``KubeAccessError`` if absent)."""
    data = secret.get("data")
    value = data.get(ref.key) if isinstance(data, dict) else None
    if not isinstance(value, str):
        raise KubeAccessError(f"Secret {ref.name} has no entry {ref.key!r}")
    try:
        return base64.b64decode(value, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError) as err:
        raise KubeAccessError(f"Secret {ref.name} entry {ref.key!r}: not base64 text") from err
