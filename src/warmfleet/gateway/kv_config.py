"""``spec.kv_events`` of a Gateway document: the engines' KV-cache events and their replay."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, model_validator

from warmfleet.core.config import StrictModel


class KvReplayConfig(StrictModel):
    """Gap recovery from the engines' replay sockets (vLLM's ``replay_endpoint``: a ROUTER that
    resends its last ``buffer_steps`` batches from a given sequence number). Each instance's
    replay socket is on the host of its URL, at ``port`` (the same on every engine, as in a
    pod) or at the instance's own port plus ``port_offset`` (several engines on one host)."""

    port: int | None = Field(default=None, ge=1, le=65535)
    port_offset: int | None = Field(default=None, ge=-65534, le=65534)
    timeout_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _one_port(self) -> KvReplayConfig:
        if (self.port is None) == (self.port_offset is None):
            raise ValueError("replay: give exactly one of port and portOffset")
        return self

    def endpoint(self, instance_url: str) -> str | None:
        """The replay endpoint of the instance at ``instance_url`` (None: no usable port)."""
        parts = urlsplit(instance_url)
        host = parts.hostname
        if host is None:
            return None
        if self.port is not None:
            port = self.port
        else:
            base = parts.port or (443 if parts.scheme == "https" else 80)
            port = base + (self.port_offset or 0)
        if not 0 < port < 65536:
            return None
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class KvEventsConfig(StrictModel):
    """Engine KV-cache events (vLLM's ZMQ publisher) feeding ``prefix_affinity``'s exact index.

    ``bind: true`` (engines configured with a concrete host *connect*, so the gateway binds
    ``endpoint`` and one socket collects every engine); ``bind: false`` connects to a relay.
    The instance is named by the topic: ``<topic_prefix><instance id>``. ``model`` is the model
    name clients send (it seeds the routing hashes); default: the tokens-mode variant's only
    entry in ``models``.
    """

    endpoint: str = Field(pattern=r"^(tcp|ipc|inproc)://.+")
    bind: bool = True
    topic_prefix: str = Field(default="kv.", min_length=1)
    model: str | None = Field(default=None, min_length=1)
    resync_batches: int = Field(default=3, ge=1)
    silence_timeout_s: float = Field(default=10.0, gt=0)
    replay: KvReplayConfig | None = None
