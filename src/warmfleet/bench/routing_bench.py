"""Routing-overhead benchmark: one full ``prefix_affinity`` decision on a large index.

One decision = build the key of an OpenAI chat body in ``text`` mode + ``choose`` +
``on_routed``, measured with ``time.perf_counter_ns`` and the thread's CPU time (a plain harness,
not a timed test; the CPU figures separate our cost from preemption on a shared machine).
The fleet has 64 instances and the approximate index holds 10^6 blocks before measuring; each
measured request is one of 64 document groups (a shared document of most of the prompt, already
indexed) plus a fresh unique question, so the match, the cost model and the index insert all run.
``choose_cpu_us_median`` separates the snapshot's cost: ``choose`` + ``on_routed`` on keys built
beforehand (an index holding only what they routed), with one snapshot throughout (``static``)
and with a new one at every decision whose routed and finished instances' loads moved, as a
gateway's are (``moving``). ``exact_claims_cpu_us``: the same decisions in exact mode (every
instance reporting KV events, each request's new blocks reported once it is routed) without and
with claims (``routing.claims``): what their bookkeeping adds a request.

    python -m warmfleet.bench.routing_bench --out bench-results/routing.json
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from warmfleet.api.replica_sync import BatchEncoder, decode_batch
from warmfleet.core.types import FleetSnapshot, InstanceState, RoutingKey
from warmfleet.routing.config import PrefixAffinityConfig, RoutingConfig
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.replica_notes import SyncNote
from warmfleet.routing.replicas import ReplicaView
from warmfleet.routing.router import Router

INSTANCES = 64
INDEXED_BLOCKS = 1_000_000
GROUPS = 64
_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def _fleet(rng: random.Random, capacity_blocks: int) -> FleetSnapshot:
    return FleetSnapshot(
        tuple(
            InstanceState(
                f"pod-{i:02d}",
                in_flight_requests=rng.randrange(0, 8),
                in_flight_tokens=rng.randrange(0, 40_000),
                kv_capacity_blocks=capacity_blocks,
            )
            for i in range(INSTANCES)
        )
    )


def _fill(router: Router, fleet: FleetSnapshot, rng: random.Random, blocks: int) -> None:
    """Index ``blocks`` synthetic blocks (chains of 1,000 blocks) spread over the fleet."""
    ids = fleet.ids()
    chain = 1000
    for n in range(blocks // chain):
        hashes = tuple(rng.getrandbits(64) for _ in range(chain))
        key = RoutingKey(hashes, 128, chain * 128, chain * 32, hashes[-1])
        decision = router.choose(key, fleet)
        router.strategy.on_routed(key, type(decision)(ids[n % len(ids)], decision.reason))


def measure(prompt_chars: int, repeats: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    config = RoutingConfig(strategy=PrefixAffinityConfig())
    router = Router(config, random.Random(seed))
    capacity = 2 * INDEXED_BLOCKS // INSTANCES
    fleet = _fleet(rng, capacity)
    router.on_instances_changed(fleet.ids())
    question_chars = max(512, prompt_chars // 16)
    documents = [_text(rng, prompt_chars - question_chars) for _ in range(GROUPS)]
    bodies: list[dict[str, Any]] = []
    for i in range(repeats + GROUPS):
        messages = [
            {"role": "system", "content": documents[i % GROUPS]},
            {"role": "user", "content": _text(rng, question_chars)},
        ]
        bodies.append({"model": "llama-3.1-70b", "messages": messages, "max_tokens": 256})
    for body in bodies[:GROUPS]:  # warm every group once
        key = router.key(parse_chat(body))
        router.on_routed(key, router.choose(key, fleet))
    _fill(router, fleet, rng, INDEXED_BLOCKS - router.strategy.index.total_blocks)  # type: ignore[attr-defined]
    indexed = router.strategy.index.total_blocks  # type: ignore[attr-defined]
    gc.collect()
    gc.freeze()
    samples: list[float] = []
    cpu_samples: list[float] = []
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    for body in bodies[GROUPS:]:
        start, cpu_start = clock(), cpu_clock()
        key = router.key(parse_chat(body))
        decision = router.choose(key, fleet)
        router.on_routed(key, decision)
        cpu_samples.append((cpu_clock() - cpu_start) / 1000.0)
        samples.append((clock() - start) / 1000.0)
    gc.unfreeze()
    samples.sort()
    return {
        "median": statistics.median(samples),
        "p90": samples[int(0.9 * (len(samples) - 1))],
        "cpu_median": statistics.median(cpu_samples),
        "cpu_p90": sorted(cpu_samples)[int(0.9 * (len(cpu_samples) - 1))],
        "indexed_blocks": indexed,
    }


def _chat_keys(
    router: Router, rng: random.Random, prompt_chars: int, count: int
) -> list[RoutingKey]:
    """Keys of ``count`` one-message chats of ``prompt_chars``: one of ``GROUPS`` shared
    documents, then a fresh question of a sixteenth (at least 512 characters)."""
    question_chars = max(512, prompt_chars // 16)
    documents = [_text(rng, prompt_chars - question_chars) for _ in range(GROUPS)]
    texts = (documents[i % GROUPS] + _text(rng, question_chars) for i in range(count))
    return [
        router.key(parse_chat({"model": "m", "messages": [{"role": "user", "content": t}]}))
        for t in texts
    ]


def measure_moving_fleet(prompt_chars: int, repeats: int, seed: int) -> dict[str, float]:
    """CPU of ``choose`` + ``on_routed`` (keys built beforehand) on a fleet whose snapshot never
    changes (``static``) and on one that is new at every decision as in a gateway (``moving``:
    the instance routed to has one more request in flight, the request routed 32 decisions
    earlier has ended, the other instances' states are the same objects). Medians, µs."""
    rng = random.Random(seed)
    fleet = _fleet(rng, 2 * INDEXED_BLOCKS // INSTANCES)
    keys = _chat_keys(_router(fleet, seed), rng, prompt_chars, repeats)
    return {
        "static": _route_all(_router(fleet, seed), keys, fleet, moving=False),
        "moving": _route_all(_router(fleet, seed), keys, fleet, moving=True),
    }


def _route_all(
    router: Router, keys: list[RoutingKey], fleet: FleetSnapshot, *, moving: bool
) -> float:
    states = {s.instance_id: s for s in fleet.instances}
    order = fleet.ids()
    open_requests: deque[tuple[str, int]] = deque()

    def moved(iid: str, requests: int, tokens: int) -> None:
        s = states[iid]
        states[iid] = InstanceState(
            iid, s.in_flight_requests + requests, s.in_flight_tokens + tokens,
            kv_capacity_blocks=s.kv_capacity_blocks,
        )  # fmt: skip

    samples: list[float] = []
    gc.collect()
    gc.freeze()
    for key in keys:
        snapshot = FleetSnapshot(tuple(states[i] for i in order)) if moving else fleet
        start = time.thread_time_ns()
        decision = router.choose(key, snapshot)
        router.on_routed(key, decision)
        samples.append((time.thread_time_ns() - start) / 1000.0)
        if moving:
            moved(decision.instance_id, 1, key.prompt_tokens)
            open_requests.append((decision.instance_id, key.prompt_tokens))
            if len(open_requests) > 32:
                iid, tokens = open_requests.popleft()
                moved(iid, -1, -tokens)
    gc.unfreeze()
    return statistics.median(samples)


def _cpu_us_each(step: Callable[[], object], count: int) -> float:
    start = time.thread_time_ns()
    step()
    return (time.thread_time_ns() - start) / 1000.0 / count


def _router(fleet: FleetSnapshot, seed: int) -> Router:
    router = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(seed))
    router.on_instances_changed(fleet.ids())
    return router


def measure_sync(prompt_chars: int, repeats: int, seed: int) -> dict[str, float]:
    """Replica sync's CPU a request on top of a decision (the module's doc), each part timed over
    all ``repeats`` requests at once, on fresh routers (the peer learns what the sender learnt)."""
    rng = random.Random(seed)
    fleet = _fleet(rng, 2 * INDEXED_BLOCKS // INSTANCES)
    plain, synced, peer = (_router(fleet, seed) for _ in range(3))
    keys = _chat_keys(plain, rng, prompt_chars, repeats)
    sender = ReplicaView("bench-a", "e/v", synced.strategy)
    receiver = ReplicaView("bench-b", "e/v", peer.strategy)
    for view in (sender, receiver):
        view.on_instances_changed(fleet.ids())
    notes: list[SyncNote] = []

    def route_plain() -> None:
        for key in keys:
            plain.on_routed(key, plain.choose(key, fleet))

    def route_through_view() -> None:
        for key in keys:
            routed = sender.routed(key, synced.choose(key, fleet))
            notes.extend((routed, sender.finished(routed)))

    gc.collect()
    gc.freeze()
    view_us = _cpu_us_each(route_through_view, repeats) - _cpu_us_each(route_plain, repeats)
    payloads: list[bytes] = []
    batched = (notes[i : i + 8] for i in range(0, len(notes), 8))
    encode = BatchEncoder().encode  # one for the stream, as a replica keeps
    encode_us = _cpu_us_each(lambda: payloads.extend(map(encode, batched)), repeats)
    batches: list[tuple[SyncNote, ...]] = []
    decode_us = _cpu_us_each(lambda: batches.extend(map(decode_batch, payloads)), repeats)
    apply_us = _cpu_us_each(lambda: [receiver.apply(n) for b in batches for n in b], repeats)
    gc.unfreeze()
    indexed = [r.strategy.index.total_blocks for r in (synced, peer)]  # type: ignore[attr-defined]
    return {"view": view_us, "encode": encode_us, "decode": decode_us, "apply": apply_us,
            "sender_indexed_blocks": indexed[0], "peer_indexed_blocks": indexed[1]}  # fmt: skip


def measure_claims(prompt_chars: int, repeats: int, seed: int) -> dict[str, float]:
    """Exact mode's CPU a request (``choose``, ``on_routed``, the engine's ``BlockStored`` of
    the new blocks) with ``claimTtlS`` 0 and 2, medians of 3 alternating runs of each; both
    make the same decisions (checked), so the difference is the claims' bookkeeping."""
    rng = random.Random(seed)
    fleet = _fleet(rng, 2 * INDEXED_BLOCKS // INSTANCES)
    keys = _chat_keys(_router(fleet, seed), rng, prompt_chars, repeats)
    decided: dict[float, list[tuple[str, int]]] = {}

    def run(claim_ttl_s: float) -> float:
        strategy = PrefixAffinityConfig(claim_ttl_s=claim_ttl_s)
        router = Router(RoutingConfig(strategy=strategy), random.Random(seed))
        router.on_instances_changed(fleet.ids())
        sink = router.kv_event_sink
        assert sink is not None
        for iid in fleet.ids():
            sink.on_instance_cleared(iid)  # reports events, nothing held yet
        out = decided[claim_ttl_s] = []

        def route_all() -> None:
            for key in keys:
                decision = router.choose(key, fleet)
                router.on_routed(key, decision)
                new = key.block_hashes[decision.predicted_cached_blocks :]
                sink.on_blocks_stored(decision.instance_id, new)
                out.append((decision.instance_id, decision.predicted_cached_blocks))

        return _cpu_us_each(route_all, repeats)

    gc.collect()
    gc.freeze()
    runs: dict[float, list[float]] = {0.0: [], 2.0: []}
    for turn in range(6):
        ttl = 2.0 if turn % 2 else 0.0
        runs[ttl].append(run(ttl))
    gc.unfreeze()
    if decided[0.0] != decided[2.0]:
        raise AssertionError("claims changed decisions with events reported at once")
    without, with_claims = (statistics.median(runs[ttl]) for ttl in (0.0, 2.0))
    return {"without": without, "with": with_claims, "added": with_claims - without}


def _decisions(small: dict[str, float], large: dict[str, float]) -> dict[str, Any]:
    """A whole decision's wall and CPU time at 8k and 128k characters (median and p90)."""
    return {
        f"decision{name}": {
            "chars_8k": round(small[field], 1),
            "chars_128k": round(large[field], 1),
        }
        for name, field in (
            ("_us_median", "median"),
            ("_us_p90", "p90"),
            ("_cpu_us_median", "cpu_median"),
            ("_cpu_us_p90", "cpu_p90"),
        )
    }


def routing_bench_command(
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("bench-results/routing.json"),
    repeats_8k: Annotated[int, typer.Option(help="decisions measured at 8k chars")] = 2000,
    repeats_128k: Annotated[int, typer.Option(help="decisions measured at 128k chars")] = 300,
    seed: Annotated[int, typer.Option(help="seed of the fleet and the texts")] = 7,
) -> None:
    """Routing-overhead benchmark: one full prefix_affinity decision on a large index."""
    small = measure(8_000, repeats_8k, seed)
    large = measure(128_000, repeats_128k, seed)
    result = _decisions(small, large)
    sync = measure_sync(8_000, repeats_8k, seed)
    moving = measure_moving_fleet(8_000, repeats_8k, seed)
    claims = measure_claims(8_000, repeats_8k, seed)
    result |= {
        "choose_cpu_us_median": {k: round(v, 1) for k, v in moving.items()},
        "replica_sync_cpu_us": {
            "chars_8k": {k: round(v, 1) for k, v in sync.items() if not k.endswith("_blocks")}
        },
        "exact_claims_cpu_us": {"chars_8k": {k: round(v, 1) for k, v in claims.items()}},
        "targets_us": {"chars_8k": 100, "chars_128k": 1000},
        "context": {
            "strategy": "prefix_affinity",
            "key_mode": "text",
            "instances": INSTANCES,
            "indexed_blocks": {
                "chars_8k": small["indexed_blocks"],
                "chars_128k": large["indexed_blocks"],
            },
            "repeats": {"chars_8k": repeats_8k, "chars_128k": repeats_128k},
            "python": platform.python_version(),
            "machine": platform.machine(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(
        f"routing decision median: 8k chars {result['decision_us_median']['chars_8k']} us, "
        f"128k chars {result['decision_us_median']['chars_128k']} us; choose + on_routed "
        f"{result['choose_cpu_us_median']['static']} us CPU, "
        f"{result['choose_cpu_us_median']['moving']} with the loads moving; replica sync at 8k: "
        + " + ".join(f"{k} {v}" for k, v in result["replica_sync_cpu_us"]["chars_8k"].items())
        + " us CPU a request; exact mode's claims add "
        f"{result['exact_claims_cpu_us']['chars_8k']['added']} us "
        f"(load average {result['context']['load_average_1m']}) -> {out}"
    )


def main() -> None:
    typer.run(routing_bench_command)


if __name__ == "__main__":
    main()
