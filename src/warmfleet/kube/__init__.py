"""Kubernetes API access shared by the gateway and the node agent (I/O)."""
