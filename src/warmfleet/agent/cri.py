"""Hand-off of image pulls to the node's container runtime (CRI) on a real Kubernetes node.

On a node the image must end up in the runtime's own store (containerd / CRI-O), so the agent
asks the runtime to pull instead of laying the image out itself; the OCI client in
``warmfleet.agent.oci`` is what runs where no runtime exists (and what the tests exercise).

``CrictlRuntime`` drives ``crictl`` (the CRI CLI). It is NOT exercised by the test suite: this
machine has no container runtime and no CRI socket. Kubelet image GC can still delete an image
no running container uses; the agent's reference counts do not reach kubelet, so on a node
keep a pod running the image (a DaemonSet, as HyperPod does) or pin it in the runtime
(containerd: the ``io.cri-containerd.pinned=pinned`` label; see containerd#10270 for its limits).
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

from warmfleet.core.errors import CacheError


class ContainerRuntimeError(CacheError):
    """The container runtime refused or failed the operation."""


class ImageRuntime(Protocol):
    async def pull(self, ref: str) -> str:
        """Pull ``ref`` into the runtime's store; return the resolved repo digest."""
        ...

    async def digest_of(self, ref: str) -> str | None:
        """The repo digest the runtime has for ``ref``, or None if absent."""
        ...

    async def remove(self, ref: str) -> None: ...


class CrictlRuntime:
    def __init__(
        self,
        crictl: str = "crictl",
        *,
        runtime_endpoint: str | None = None,
        timeout_s: float = 1800.0,
    ) -> None:
        self._crictl = crictl
        self._endpoint = runtime_endpoint
        self._timeout_s = timeout_s

    async def _run(self, *args: str) -> str:
        cmd = [self._crictl]
        if self._endpoint:
            cmd += ["--runtime-endpoint", self._endpoint, "--image-endpoint", self._endpoint]
        proc = await asyncio.create_subprocess_exec(
            *cmd, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise ContainerRuntimeError(
                f"crictl {' '.join(args)}: timed out after {self._timeout_s}s"
            ) from exc
        if proc.returncode != 0:
            raise ContainerRuntimeError(f"crictl {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    async def pull(self, ref: str) -> str:
        await self._run("pull", ref)
        digest = await self.digest_of(ref)
        if digest is None:
            raise ContainerRuntimeError(f"crictl pulled {ref} but does not report a repo digest")
        return digest

    async def digest_of(self, ref: str) -> str | None:
        try:
            doc = json.loads(await self._run("inspecti", "-o", "json", ref))
        except ContainerRuntimeError:
            return None
        digests = doc.get("status", {}).get("repoDigests") or []
        return str(digests[0]).split("@", 1)[-1] if digests else None

    async def remove(self, ref: str) -> None:
        await self._run("rmi", ref)
