"""Fast, seeded, stable 64-bit hashing (xxh3) and chained block hashes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

_MASK64 = (1 << 64) - 1


def hash_bytes(data: bytes, seed: int = 0) -> int:
    """Stable 64-bit hash of ``data`` under ``seed``."""
    return int(xxhash.xxh3_64_intdigest(data, seed & _MASK64))


def hash_str(text: str, seed: int = 0) -> int:
    return hash_bytes(text.encode("utf-8", "surrogatepass"), seed)


def hash_int(value: int, seed: int = 0) -> int:
    return hash_bytes((value & _MASK64).to_bytes(8, "little"), seed)


def chain_seed(salt: str, *parts: str | None) -> int:
    """Start of a hash chain: the per-deployment salt plus model, adapter, tenant and so on."""
    seed = hash_str(salt)
    for part in parts:
        seed = hash_str(part or "", seed)
    return seed


def chain_blocks(blocks: Iterable[bytes], seed: int) -> tuple[int, ...]:
    """Chained hashes: h[i] = H(block[i], seed=h[i-1]), h[-1] = seed."""
    out: list[int] = []
    prev = seed
    for block in blocks:
        prev = int(xxhash.xxh3_64_intdigest(block, prev))
        out.append(prev)
    return tuple(out)


def chain_ids(ids: Sequence[int], seed: int) -> tuple[int, ...]:
    """Chained hashes of integer block ids (used for traces that already give block ids)."""
    out: list[int] = []
    prev = seed
    for block_id in ids:
        prev = int(xxhash.xxh3_64_intdigest((block_id & _MASK64).to_bytes(8, "little"), prev))
        out.append(prev)
    return tuple(out)
