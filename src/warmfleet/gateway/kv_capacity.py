"""The engines' KV cache capacity, read from their Prometheus metrics, so that the approximate
prefix index forgets as each engine does: ``prefix_affinity`` keeps one LRU of routing-key
blocks per instance, as large as that instance's cache (``InstanceState.kv_capacity_blocks``);
an instance whose capacity is unknown gets the strategy's ``defaultCapacityBlocks``.

- vLLM: ``vllm:cache_config_info{num_gpu_blocks, block_size}`` (their product, in tokens).
- SGLang: ``sglang:max_total_num_tokens``.
- The emulator exports vLLM's series; any other OpenAI-compatible server without them (or
  without ``/metrics``) keeps the default.

Owned by the app lifespan (``run``, cancelled on shutdown). Every ``ROUND_S`` it reads the
``/metrics`` of each instance address that is due (data-parallel ranks share one): a new one
at once, then every ``REFRESH_S``, one that gave no capacity every ``RETRY_S``, and one the
health probes saw down at the previous round as soon as they see it back (an engine restarted,
maybe with another cache size). A read that fails (refused, timed out, not 200, larger than
``MAX_METRICS_BYTES``) changes nothing. Each round also converts every known capacity with
the variant's key settings of the moment (a reload may change the block size or key mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import ClientError, ClientSession
from prometheus_client.parser import text_string_to_metric_families

from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.probes import Prober
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)
METRICS_PATH = "/metrics"
ROUND_S = 5.0
REFRESH_S = 600.0
RETRY_S = 30.0
MAX_METRICS_BYTES = 8 << 20
_VLLM = "vllm:cache_config_info"  # a gauge set to 1, its labels the engine's CacheConfig
_SGLANG = "sglang:max_total_num_tokens"


def kv_capacity_tokens(text: str) -> int:
    """The KV capacity (tokens) an engine's metrics state; the smallest if several engines
    (data-parallel ranks) state one; 0 if none does or the text is not Prometheus's format."""
    found: list[int] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name == _VLLM:
                    blocks = sample.labels.get("num_gpu_blocks", "")
                    size = sample.labels.get("block_size", "")
                    if blocks.isdigit() and size.isdigit():
                        found.append(int(blocks) * int(size))
                elif family.name == _SGLANG and 0 < sample.value < 1 << 48:  # not NaN, not inf
                    found.append(int(sample.value))
    except (ValueError, IndexError, KeyError, TypeError) as err:
        log.debug("engine metrics not parsed: %r", err)
        return 0
    return min((tokens for tokens in found if tokens > 0), default=0)


@dataclass(eq=False)
class MetricsPoller:
    """A lifespan task that reads the engines' ``/metrics`` (``metrics_text``) for ``state``'s
    variants: this probe and ``gateway.engine_stats.EngineStatsProbe``, each on its own pool
    (``session``), each read timed from when it has its slot (``gateway.probes``)."""

    state: GatewayState
    session: ClientSession
    clock: Callable[[], float] = field(default=time.monotonic, kw_only=True)
    rounds_completed: int = field(default=0, init=False)
    prober: Prober = field(init=False)

    def __post_init__(self) -> None:
        self.prober = Prober(self.session)


@dataclass(eq=False)
class KvCapacityProbe(MetricsPoller):
    """Reads the engines' capacities into their ``InstanceRuntime`` (the module's docstring)."""

    # instance address -> when to read it next; addresses the health probes saw down at the
    # last round
    _due_s: dict[str, float] = field(default_factory=dict, init=False)
    _down: set[str] = field(default_factory=set, init=False)

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(ROUND_S)

    async def poll_once(self) -> None:
        """Read the capacity of every address that is due; apply what is known."""
        now_s = self.clock()
        due: dict[str, list[tuple[VariantRuntime, InstanceRuntime]]] = {}
        seen: set[str] = set()
        down: set[str] = set()
        for variant in self.state.variants():
            for inst in variant.instances.values():
                seen.add(inst.base_url)
                if not inst.active_healthy:
                    down.add(inst.base_url)
                elif inst.base_url in self._down:  # back: read now, whenever it was due
                    self._due_s[inst.base_url] = now_s
                if inst.kv_capacity_tokens:  # the key settings may have changed
                    _apply(variant, inst, inst.kv_capacity_tokens)
                if self._due_s.get(inst.base_url, 0.0) <= now_s:
                    due.setdefault(inst.base_url, []).append((variant, inst))
        self._down = down
        for gone in self._due_s.keys() - seen:
            del self._due_s[gone]
        urls = list(due)
        results = await asyncio.gather(*(self.read(url) for url in urls))
        for url, tokens in zip(urls, results, strict=True):
            self._due_s[url] = now_s + (REFRESH_S if tokens else RETRY_S)
            if tokens is None:
                continue
            for variant, inst in due[url]:
                if not inst.removed:
                    _apply(variant, inst, tokens)
        self.rounds_completed += 1

    async def read(self, base_url: str) -> int | None:
        """The capacity ``base_url``'s metrics state (0: none); None if they could not be read."""
        text = await metrics_text(self.prober, base_url, self.state.health.timeout_s)
        return None if text is None else kv_capacity_tokens(text)


async def metrics_text(prober: Prober, base_url: str, timeout_s: float) -> str | None:
    """``base_url``'s ``/metrics`` page; None if it could not be read in ``timeout_s`` (from when
    the read has its slot), was not a 200 or was over ``MAX_METRICS_BYTES`` (also read by
    ``gateway.engine_stats``)."""
    try:
        async with prober.get(base_url + METRICS_PATH, timeout_s) as resp:
            if resp.status != 200:
                return None
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    log.warning("%s%s: over %d bytes", base_url, METRICS_PATH, MAX_METRICS_BYTES)
                    return None
    except (ClientError, TimeoutError, OSError) as err:
        log.debug("engine metrics of %s not read: %r", base_url, err)
        return None
    return body.decode("utf-8", "replace")


def _apply(variant: VariantRuntime, inst: InstanceRuntime, tokens: int) -> None:
    blocks = variant.routing_config.key.capacity_blocks(tokens)
    if (tokens, blocks) != (inst.kv_capacity_tokens, inst.kv_capacity_blocks):
        if tokens != inst.kv_capacity_tokens:
            log.info("%s/%s/%s: KV capacity %d tokens (%d key blocks)",
                     variant.endpoint, variant.name, inst.instance_id, tokens, blocks)  # fmt: skip
        inst.set_kv_capacity(tokens, blocks)
