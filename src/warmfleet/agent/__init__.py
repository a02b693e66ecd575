"""warmfleet.agent: the node agent, an I/O shell on every node.

Fetches model weights from their sources (``sources``: local, HTTP, Hugging Face, S3) and images
from OCI registries (``oci``) into the node's cache (``store``, ``downloader``), verifies digests,
serves its status API (``status_api``) and metrics, and marks its Node (``kube_node``). It plans
with the pure ``warmfleet.cache`` and speaks ``warmfleet.api``; it may use ``warmfleet.kube``,
never the gateway, the emulator, the operator or ``warmfleet.control``.
"""
