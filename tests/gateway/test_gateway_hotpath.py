"""The hot path's fast pieces give exactly what the slow, obvious versions give.

- ``SpanMemo.chain`` (memoised spans of chained block hashes) == ``chains.chain_buffer``.
- ``FastHistogram`` / ``FastCounter`` / ``FastGauge`` expose the same samples as the
  ``prometheus_client`` metrics they replace.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmfleet.gateway.metrics import FastCounter, FastGauge, FastHistogram
from warmfleet.routing.chains import SpanMemo, chain_buffer
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

_BUCKETS = (0.00005, 0.0001, 0.0005, 0.001, 0.01, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=600),
    block=st.sampled_from([1, 2, 3, 8]),
    max_blocks=st.integers(1, 300),
    seed=st.integers(0, (1 << 64) - 1),
    max_entries=st.integers(1, 4),
    repeats=st.integers(1, 3),
)
def test_span_memo_equals_chain_buffer(
    data: bytes, block: int, max_blocks: int, seed: int, max_entries: int, repeats: int
) -> None:
    memo = SpanMemo(max_entries=max_entries)
    expected = chain_buffer(data, 1, block, max_blocks, seed)
    n_blocks = min(len(data) // block, max_blocks)
    for _ in range(repeats):  # cold, then from the memo (tiny: also cleared when full)
        assert memo.chain(data, block, n_blocks, seed) == expected
        assert len(memo) <= max_entries


def test_key_builder_keys_unchanged_by_the_memo() -> None:
    builder = key_builder(KeySpec())
    shared = "shared system prompt " * 120
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": shared + f"q{i} " * 50}]}
        for i in range(6)
    ]
    for body in [*bodies, *bodies]:
        key = builder.key(parse_chat(body))
        text = "\x1euser\x1f\x1f\x1f" + body["messages"][0]["content"]  # type: ignore[index]
        seed = builder.seed("m", None, None)
        assert key.block_hashes == chain_buffer(text.encode(), 1, 128, 1 << 20, seed)
    assert len(builder.spans) > 0


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@settings(max_examples=100, deadline=None)
@given(
    observations=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.one_of(st.sampled_from(_BUCKETS), st.floats(0, 2, allow_nan=False)),
        ),
        max_size=40,
    )
)
def test_fast_metrics_expose_what_prometheus_client_does(
    observations: list[tuple[str, float]],
) -> None:
    fast, slow = CollectorRegistry(), CollectorRegistry()
    labels = ("endpoint", "variant")
    fh = FastHistogram("h_seconds", "h", labels, buckets=_BUCKETS, registry=fast)
    sh = Histogram("h_seconds", "h", labels, buckets=_BUCKETS, registry=slow)
    fc = FastCounter("c", "c", labels, fast)
    sc = Counter("c", "c", labels, registry=slow)
    fg = FastGauge("g", "g", labels, fast)
    sg = Gauge("g", "g", labels, registry=slow)
    for name, value in observations:
        fh.labels("e", name).observe(value)
        sh.labels("e", name).observe(value)
        fc.labels("e", name).inc(value)
        sc.labels("e", name).inc(value)
        fg.labels("e", name).inc(1)
        sg.labels("e", name).inc(1)
        fg.labels("e", name).dec(0.5)
        sg.labels("e", name).dec(0.5)
    got, want = _samples(fast), _samples(slow)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    if observations:
        fg.remove("e", observations[0][0])
        sg.remove("e", observations[0][0])
        assert _samples(fast).keys() == _samples(slow).keys()
