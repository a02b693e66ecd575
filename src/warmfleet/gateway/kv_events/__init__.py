"""Engine KV events (vLLM's ZMQ publisher) -> the routing core's exact prefix index.

Wire format (vLLM ``--kv-events-config '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:P",
"topic":"kv.<instance-id>"}'``): multipart ``[topic, seq (8-byte big-endian), msgpack EventBatch]``
where an ``EventBatch`` is ``[ts, [event, ...], data_parallel_rank]`` and each event is a map
tagged by ``type``: ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``,
``block_size``, ``lora_id``, ``medium``, ``lora_name``, ``extra_keys``, ``group_idx``, ...),
``BlockRemoved`` (``block_hashes``, ``medium``) or ``AllBlocksCleared``. vLLM queues an
``AllBlocksCleared`` on ``POST /reset_prefix_cache`` and publishes it with the next engine
step. With a concrete host in ``endpoint`` the engine *connects*, so the gateway's SUB socket
binds and one socket collects every engine; the instance is named by the topic
(``kv.<instance-id>``).

Engine block hashes are not the router's: ``KvEventTranslator`` recomputes the router's chained
hash of each stored block from the event's ``token_ids`` and the router hash of its parent (kept
per instance, engine hash -> router hash), with the router's seed for root blocks. Only the
engine's own tier counts (``medium`` GPU or absent; offload tiers are ignored). Blocks of a LoRA
adapter or with extra hash keys (multimodal, cache salt), and their children, are never indexed:
the router's keys cannot name them.

Gaps: each instance's batches carry a sequence number. A first batch numbered 0 is the
engine's whole history (``exact``). A missing number, a first batch that is not number 0 (the
subscriber joined late) or a stored block whose parent is unknown means the exact view may be
incomplete: the instance drops out of the exact index (so ``prefix_affinity`` uses its
approximate index for it: mode ``approximate``) and resyncs: it returns to ``exact`` on an
``AllBlocksCleared`` (a full reset) or after ``resync_batches`` consecutive batches whose every
stored block translated, with the blocks seen since the gap (a subset of the truth).
With ``replay`` (vLLM's ``replay_endpoint``), a gap or a late join first asks the engine for the
missed batches and holds the instance's new ones meanwhile; only if the answer does not cover
the gap does the instance fall back.
Silence: ``expect_events`` (called when a request that must store new blocks is routed) arms a
deadline; if no batch arrives from that instance within ``silence_timeout_s`` it goes
``approximate`` too. See docs/real-vllm.md.
"""

from warmfleet.api.kv_events import (
    TOPIC_PREFIX,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    decode_batch,
    decode_frames,
    encode_batch,
    encode_frames,
    instance_of_topic,
)
from warmfleet.gateway.kv_events.translator import (
    BatchConsumer,
    ExactIndex,
    KvEventTranslator,
    router_block_hashes,
)
from warmfleet.gateway.kv_events.transport import KvEventRelay, KvEventSubscriber
from warmfleet.gateway.kv_events.view import TranslatorStats
from warmfleet.gateway.kv_events.wiring import ExactModeRouter, KvEventFeed

__all__ = [
    "TOPIC_PREFIX",
    "AllBlocksCleared",
    "BatchConsumer",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "ExactIndex",
    "ExactModeRouter",
    "KvEventDecodeError",
    "KvEventFeed",
    "KvEventRelay",
    "KvEventSubscriber",
    "KvEventTranslator",
    "TranslatorStats",
    "decode_batch",
    "decode_frames",
    "encode_batch",
    "encode_frames",
    "instance_of_topic",
    "router_block_hashes",
]
