"""A capture-like trace in warmfleet's format, generated (seeded) for the doctor's tests: tenants
with their own system prompt, multi-turn sessions whose prompts grow, instances ``i0``/``i1``
from the start and ``i2`` joining at ``join_s``, engine-reported cached tokens."""

from __future__ import annotations

import json
import random

from warmfleet.api.trace_format import TraceHeader, TraceRecord, header_line, record_line

BLOCK_TOKENS = 64


def capture_lines(
    requests: int,
    *,
    seed: int = 0,
    rate_rps: float = 5.0,
    join_s: float = 120.0,
    header: bool = True,
    engine: bool = True,
) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    if header:
        fleet = {"instances": 2, "preset": "llama-3.1-8b-h100", "kv_capacity_tokens": 200_000,
                 "strategy": {"type": "prefix_hash", "concurrencyThreshold": 5}}  # fmt: skip
        out.append(header_line(TraceHeader.model_validate({"block_tokens": BLOCK_TOKENS,
                                                            "fleet": fleet})))  # fmt: skip
    next_id = 1000
    sessions: dict[str, list[int]] = {}
    system = {t: list(range(t * 100, t * 100 + 8)) for t in range(3)}
    now_ms = 0.0
    for index in range(requests):
        now_ms += rng.expovariate(rate_rps) * 1000.0
        tenant = rng.randrange(3)
        session = f"t{tenant}-s{rng.randrange(40)}"
        ids = sessions.setdefault(session, list(system[tenant]))
        grown = rng.randint(1, 4)
        ids.extend(range(next_id, next_id + grown))
        next_id += grown
        if len(ids) > 60:
            ids[:] = list(system[tenant])
        instances = ["i0", "i1"] + (["i2"] if now_ms / 1000.0 > join_s else [])
        record: dict[str, object] = {
            "timestamp": round(now_ms, 3), "input_length": len(ids) * BLOCK_TOKENS - 10,
            "output_length": rng.randint(10, 200), "hash_ids": list(ids),
            "tenant": f"tenant-{tenant}", "session": session, "priority": tenant % 2,
            "instance": rng.choice(instances),
        }  # fmt: skip
        if engine:
            record["engine_cached_tokens"] = max(0, (len(ids) - 3) * BLOCK_TOKENS) * (index % 2)
        out.append(record_line(TraceRecord.model_validate(record)))
    return out


def write_capture(path: object, lines: list[str]) -> None:
    from pathlib import Path  # noqa: PLC0415

    Path(str(path)).write_text("\n".join(lines) + "\n", encoding="utf-8")


def load(path: object) -> dict[str, object]:
    from pathlib import Path  # noqa: PLC0415

    data: dict[str, object] = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    return data
