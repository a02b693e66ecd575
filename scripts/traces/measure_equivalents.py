"""Measure the real traces for the synthetic equivalents (warmfleet.sim.workloads.equivalents).

Reads the three default trace files from a traces directory (default ../shared/traces) and prints
the figures the equivalents' constants were copied from: request counts, arrival rates per
5-minute window, the gaps' coefficient of variation, nearest-rank
quantiles of the lengths, and Mooncake's prefix structure (which earlier request a prompt
continues, how much of it it keeps, how many blocks it adds). Standard library only; run from the
repository root:

    python scripts/traces/measure_equivalents.py [TRACES_DIR]
"""

from __future__ import annotations

import collections
import csv
import itertools
import json
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

PROBS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
WINDOW_S = 300.0  # rate windows: 5 minutes keep each trace's spread of requests per minute


def quantiles(values: list[float]) -> list[tuple[float, float]]:
    ordered = sorted(values)
    return [(p, round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)) for p in PROBS]


def window_rates(stamps_s: list[float], window_s: float = WINDOW_S) -> list[float]:
    """Requests per second in each window (the last one over its own length)."""
    end_s = max(stamps_s)
    counts = collections.Counter(int(t // window_s) for t in stamps_s)
    rates = []
    for window in range(int(end_s // window_s) + 1):
        length_s = min(window_s, end_s - window * window_s) or window_s
        rates.append(round(counts[window] / length_s, 3))
    return rates


def mooncake(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    owner: dict[int, int] = {}
    fresh: list[float] = []
    kept: list[float] = []
    added: list[float] = []
    gaps_s: list[float] = []
    for index, row in enumerate(rows):
        ids = row["hash_ids"]
        matched = 0
        while matched < len(ids) and ids[matched] in owner:
            matched += 1
        if matched >= 2:  # continues an earlier prompt beyond the shared block 0
            parent = rows[owner[ids[matched - 1]]]
            kept.append(matched / len(parent["hash_ids"]))
            added.append(len(ids) - matched)
            gaps_s.append((row["timestamp"] - parent["timestamp"]) / 1000)
        else:
            fresh.append(row["input_length"])
        owner.update((h, index) for h in ids)
    print(f"mooncake {path.name}: {len(rows)} requests")
    print("  rates per 5 min:", window_rates([r["timestamp"] / 1000 for r in rows]))
    print(f"  follow-up share: {len(kept) / len(rows):.4f}")
    print("  fresh input tokens:", quantiles(fresh))
    print("  output tokens:", quantiles([r["output_length"] for r in rows]))
    print("  follow-up: parent gap s:", quantiles(gaps_s))
    print("  follow-up: kept fraction of the parent's blocks:", quantiles(kept))
    print("  follow-up: added blocks:", quantiles(added))


def azure(path: Path) -> None:
    rows = list(csv.DictReader(path.read_text().splitlines()))
    stamps = [
        datetime.fromisoformat(r["TIMESTAMP"][:26]).replace(tzinfo=UTC).timestamp() for r in rows
    ]
    start = min(stamps)
    offsets = [s - start for s in stamps]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    print(f"azure {path.name}: {len(rows)} requests over {max(offsets):.1f} s")
    print("  rates per 5 min:", window_rates(offsets))
    print(f"  gap cv: {statistics.pstdev(gaps) / statistics.mean(gaps):.3f}")
    print("  input tokens:", quantiles([int(r["ContextTokens"]) for r in rows]))
    print("  output tokens:", quantiles([int(r["GeneratedTokens"]) for r in rows]))


def sharegpt(path: Path) -> None:
    items = json.loads(path.read_text())
    sessions: dict[str, int] = {}
    turns: collections.Counter[int] = collections.Counter()
    last: dict[int, str] = {}
    first: list[float] = []
    growth: list[float] = []
    for item in items:
        text = str(item["input"])
        session = sessions.setdefault(text[:256], len(sessions))
        turns[session] += 1
        if session in last:
            growth.append(len(text) - len(last[session]))
        else:
            first.append(len(text))
        last[session] = text
    print(f"sharegpt {path.name}: {len(items)} requests, {len(sessions)} sessions")
    print("  turns per session:", sorted(collections.Counter(turns.values()).items()))
    print("  first prompt chars:", quantiles(first))
    print("  growth chars per turn:", quantiles(growth))
    print("  output tokens:", quantiles([int(str(i["output_length"])) for i in items]))


def main() -> None:
    traces = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/traces")
    mooncake(traces / "mooncake_conversation_first30min.jsonl")
    azure(traces / "azure_llm_2023_conv.csv")
    sharegpt(traces / "text" / "lmbenchmark_sharegpt_run.json")


if __name__ == "__main__":
    main()
