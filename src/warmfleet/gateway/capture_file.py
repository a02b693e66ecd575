"""The capture's file side (``gateway.capture``): what one captured request holds
(``Captured``), its trace record (docs/trace-format.md) and the file it is written to, with
rotation. ``CaptureFile.write`` runs on a worker thread, never on the event loop.

Privacy: a record holds the key's salted block hashes, lengths, timings and names the gateway
chose (model, variant, instance, reason); the tenant is written as a hash salted with the
variant's ``routing.key.salt``, the session as the key's own salted session hash. No prompt
text, no raw tenant or session value, no unsalted hash is ever written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson
import xxhash

from warmfleet.core.hashing import chain_seed
from warmfleet.core.types import Decision, RoutingKey
from warmfleet.gateway.capture_config import CaptureConfig

log = logging.getLogger(__name__)

_TENANT_TAG = "warmfleet-capture-tenant"
_MAX_SEEDS = 64
_MAX_ID_TEXTS = 1 << 16  # block ids whose decimal text is kept (shared prefixes repeat them)
# TraceRecord's bounds on the names a line carries: a longer one is left out of its line
_MAX_NAME = {"model": 512, "variant": 256, "instance": 256, "reason": 64}
_MAX_MODEL, _MAX_VARIANT, _MAX_INSTANCE, _MAX_REASON = _MAX_NAME.values()
_COMPACT = (",", ":")
_FAST_FLOAT_LIMIT = 1e15  # ms: below it orjson and ``repr`` write a rounded float alike
_BUFFER_BYTES = 64 << 10  # the file's buffer: lines are written into it one by one
_DECODER = json.JSONDecoder()  # one for every usage snippet (building one costs ~1 us)


class Captured(NamedTuple):
    """One answered request as the proxy hands it over (references, no copies but ``usage``:
    at most ``USAGE_BYTES`` of the answer from its ``"usage"`` field on)."""

    t_start_s: float  # perf_counter: the request arrived
    t_first_s: float  # perf_counter: its first byte went to the client (0.0: none)
    t_end_s: float  # perf_counter: the instance finished
    key: RoutingKey
    decision: Decision
    instance: str
    variant: str
    salt: str  # the variant's routing.key.salt
    status: int
    usage: bytes | None
    tenant: str | None  # raw: hashed on the writer, never written
    model: str | None
    # flow control's (routing.flow): the priority and deadline it acted on, its TTFT prediction
    priority: int | None = None
    deadline_ms: float | None = None
    predicted_ttft_s: float | None = None


class WriteResult(NamedTuple):
    lines: int
    bytes: int
    rotations: int
    failed: int


def usage_of(snippet: bytes | None) -> tuple[int | None, int | None, int | None]:
    """(prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) of an OpenAI
    ``usage`` object starting at ``snippet`` (each ``None`` when absent or not a count).

    orjson reads the object when its end is where its braces balance (JSON objects are prefix
    free: a slice that parses is the object the standard library's ``raw_decode`` reads there);
    anything else (a brace inside a string, ``null``, past-64-bit numbers, bad UTF-8) goes to
    ``raw_decode``."""
    if not snippet:
        return None, None, None
    colon = snippet.find(b":")
    value: object = None
    rest = snippet[colon + 1 :].lstrip()
    end = _object_end(rest) if rest[:1] == b"{" else -1
    if end > 0:
        try:
            value = orjson.loads(rest[:end])
        except orjson.JSONDecodeError:
            value = None
    if value is None:
        try:
            value, _end = _DECODER.raw_decode(rest.decode())
        except (ValueError, UnicodeDecodeError):
            return None, None, None
    if not isinstance(value, dict):
        return None, None, None
    details = value.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return _count(value.get("prompt_tokens")), _count(value.get("completion_tokens")), cached


def _object_end(data: bytes) -> int:
    """Where the object at ``data``'s start ends if its braces balance (strings not read:
    the caller parses the slice), else -1."""
    depth = at = 0
    while True:
        close = data.find(b"}", at)
        if close < 0:
            return -1
        depth += data.count(b"{", at, close) - 1
        at = close + 1
        if depth <= 0:
            return at if depth == 0 else -1


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ms(start_s: float, end_s: float) -> float:
    """Milliseconds from ``start_s`` to ``end_s`` (0 if negative), to the microsecond: the
    nearest float to a whole number of microseconds / 1000 (``round(x, 3)`` formats the
    number as text to round it: ~6x slower)."""
    return max(0, round((end_s - start_s) * 1e6)) / 1000.0


def _positive_ms(value_ms: float | None) -> float | None:
    """A deadline as the format takes it: to the microsecond, left out below one."""
    if value_ms is None:
        return None
    rounded = round(value_ms, 3)
    return rounded if rounded > 0.0 else None


class RecordMaker:
    """Turns ``Captured`` into trace records (keeps the tenant seeds of the salts it saw)."""

    def __init__(self) -> None:
        self._seeds: dict[str, int] = {}
        self._id_texts: dict[int, str] = {}

    def tenant_hash(self, tenant: str, salt: str) -> str:
        seed = self._seeds.get(salt)
        if seed is None:
            if len(self._seeds) >= _MAX_SEEDS:
                self._seeds.clear()
            seed = self._seeds[salt] = chain_seed(salt, _TENANT_TAG)
        return xxhash.xxh3_64_hexdigest(tenant.encode("utf-8", "surrogatepass"), seed)

    def record(self, item: Captured, t0_s: float) -> dict[str, Any]:
        key = item.key
        prompt, completion, cached = usage_of(item.usage)
        session = key.session  # salted under the chain seed (routing.sessions)
        status = item.status
        predicted = item.predicted_ttft_s
        return {
            "timestamp": _ms(t0_s, item.t_start_s),
            "input_length": key.prompt_tokens if prompt is None else prompt,
            "output_length": key.output_tokens_hint if completion is None else completion,
            "hash_ids": key.block_hashes,
            "tenant": self.tenant_hash(item.tenant, item.salt) if item.tenant else None,
            "session": f"{session:016x}" if session is not None else None,
            "priority": item.priority,
            "deadline_ms": _positive_ms(item.deadline_ms),
            "model": item.model,
            "variant": item.variant,
            "instance": item.instance,
            "reason": str(item.decision.reason),
            "predicted_cached_tokens": item.decision.predicted_cached_blocks * key.block_size,
            "engine_cached_tokens": cached,
            "ttft_ms": _ms(item.t_start_s, item.t_first_s) if item.t_first_s else None,
            "e2e_ms": _ms(item.t_start_s, item.t_end_s),
            "status": status if 100 <= status <= 599 else None,
            "predicted_ttft_ms": None if predicted is None else round(predicted * 1000.0, 3),
        }

    def line(self, item: Captured, t0_s: float) -> str:
        """``record_line(self.record(item, t0_s))``, built without the record model (its
        validation and the decimal text of every block id cost 0.2 µs a block): the same text,
        field for field."""
        return self.line_bytes(item, t0_s)[:-1].decode()

    def line_bytes(self, item: Captured, t0_s: float) -> bytes:
        """``line`` as UTF-8 with its newline. orjson writes it (~4x faster than the standard
        library's two ``json.dumps``), from the fields set (``record``'s order), when its text is
        the standard library's: every string ASCII (orjson leaves other characters unescaped)
        and every number within what both write alike (64-bit integers; the ``_ms`` floats,
        rounded to the microsecond, far below 1e16 where the float formats part); otherwise the
        standard library writes it."""
        key, model, variant, instance = item.key, item.model, item.variant, item.instance
        t_start_s, t_first_s = item.t_start_s, item.t_first_s
        timestamp, e2e_ms = _ms(t0_s, t_start_s), _ms(t_start_s, item.t_end_s)
        ttft_ms = _ms(t_start_s, t_first_s) if t_first_s else 0.0
        deadline_ms = _positive_ms(item.deadline_ms)
        predicted = item.predicted_ttft_s
        predicted_ms = None if predicted is None else round(predicted * 1000.0, 3)
        if not (
            (model is None or model.isascii())
            and variant.isascii()
            and instance.isascii()
            and timestamp < _FAST_FLOAT_LIMIT
            and e2e_ms < _FAST_FLOAT_LIMIT
            and ttft_ms < _FAST_FLOAT_LIMIT
            and (deadline_ms is None or deadline_ms < _FAST_FLOAT_LIMIT)
            and (predicted_ms is None or abs(predicted_ms) < _FAST_FLOAT_LIMIT)
        ):
            return (self._slow_line(item, t0_s) + "\n").encode()
        prompt, completion, cached = usage_of(item.usage)
        fields: dict[str, Any] = {
            "timestamp": timestamp,
            "input_length": key.prompt_tokens if prompt is None else prompt,
            "output_length": key.output_tokens_hint if completion is None else completion,
            "hash_ids": key.block_hashes,
        }
        self._add_labels(fields, item, deadline_ms)
        fields["predicted_cached_tokens"] = item.decision.predicted_cached_blocks * key.block_size
        if cached is not None:
            fields["engine_cached_tokens"] = cached
        if t_first_s:
            fields["ttft_ms"] = ttft_ms
        fields["e2e_ms"] = e2e_ms
        if 100 <= item.status <= 599:
            fields["status"] = item.status
        if predicted_ms is not None:
            fields["predicted_ttft_ms"] = predicted_ms
        try:
            return orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:  # an integer past 64 bits: the standard library's
            return (self._slow_line(item, t0_s) + "\n").encode()

    def _add_labels(
        self, fields: dict[str, Any], item: Captured, deadline_ms: float | None
    ) -> None:
        """``line_bytes``' fields after ``hash_ids``, through ``reason``, in ``record``'s order."""
        model, variant, instance = item.model, item.variant, item.instance
        if item.tenant:
            fields["tenant"] = self.tenant_hash(item.tenant, item.salt)
        if item.key.session is not None:
            fields["session"] = f"{item.key.session:016x}"
        if item.priority is not None:
            fields["priority"] = item.priority
        if deadline_ms is not None:
            fields["deadline_ms"] = deadline_ms
        if model is not None and len(model) <= _MAX_MODEL:
            fields["model"] = model
        if len(variant) <= _MAX_VARIANT:
            fields["variant"] = variant
        if len(instance) <= _MAX_INSTANCE:
            fields["instance"] = instance
        reason = str(item.decision.reason)
        if len(reason) <= _MAX_REASON:
            fields["reason"] = reason

    def _slow_line(self, item: Captured, t0_s: float) -> str:
        """``line`` by the standard library (the ids of a shared prefix converted once)."""
        fields = self.record(item, t0_s)
        ids = fields.pop("hash_ids")
        for name, limit in _MAX_NAME.items():
            value = fields[name]
            if value is not None and len(value) > limit:
                fields[name] = None
        head = {k: fields.pop(k) for k in ("timestamp", "input_length", "output_length")}
        tail = {k: v for k, v in fields.items() if v is not None}
        text = json.dumps(head, separators=_COMPACT)[:-1] + ',"hash_ids":[' + self._ids(ids)
        return text + ("]," + json.dumps(tail, separators=_COMPACT)[1:] if tail else "]}")

    def _ids(self, ids: Sequence[int]) -> str:
        texts = self._id_texts
        if len(texts) + len(ids) > _MAX_ID_TEXTS:
            texts.clear()
        get = texts.get
        out = []
        for block_id in ids:
            text = get(block_id)
            if text is None:
                text = texts[block_id] = str(block_id)
            out.append(text)
        return ",".join(out)


class CaptureFile:
    """The capture file at ``config.path``: each file starts with a header line; past
    ``max_bytes`` it is rotated (``path`` -> ``path.1`` -> ... ``path.<keep_files>``). An existing
    file is rotated away when the capture opens (a file is one capture, its timestamps from
    its first record's arrival). Thread-safe (one lock): ``write`` runs on a worker thread."""

    def __init__(self, config: CaptureConfig) -> None:
        self.path = Path(config.path)
        self.max_bytes = config.max_bytes
        self.keep_files = config.keep_files
        self.records = RecordMaker()
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._size = 0
        self._flushed = 0  # bytes of the open file known written (whole lines)
        self._t0_s = 0.0
        self._closed = False

    def write(self, items: Sequence[Captured], header: str) -> WriteResult:
        """Format and append ``items`` (``header``: the first line of a new file)."""
        with self._lock:
            if self._closed:
                return WriteResult(0, 0, 0, len(items))
            try:
                return self._append(items, header.encode() + b"\n")
            except OSError as err:
                log.error("capture: cannot write %s: %s", self.path, err)
                torn = self._file is not None
                self._drop_file()
                if torn:  # a full disk took part of a line: keep the file whole lines only
                    with contextlib.suppress(OSError):
                        os.truncate(self.path, self._flushed)
                return WriteResult(0, 0, 0, len(items))

    def _line(self, item: Captured) -> bytes | None:
        try:
            return self.records.line_bytes(item, self._t0_s)
        except (TypeError, ValueError) as err:  # a bug: the line is dropped and counted
            log.warning("capture: a record left out: %r", err)
            return None

    def _append(self, items: Sequence[Captured], head: bytes) -> WriteResult:
        """Each file's timestamps count from its first record's arrival. Each line goes into
        the file's buffer as it is made (no batch-sized join: a fresh buffer of that size is
        page-faulted in on every batch, which cost as much as formatting the lines)."""
        rotations = written = lines = 0
        out = self._file
        for item in items:
            if out is None:
                rotations += self._rotate_earlier_capture()
                out = self._open_fresh(head)
                written += len(head)
                self._t0_s = item.t_start_s
            line = self._line(item)
            if line is None:
                continue
            if self._size + len(line) > self.max_bytes and self._size > len(head):
                self._rotate()
                rotations += 1
                out = self._open_fresh(head)
                written += len(head)
                self._t0_s = item.t_start_s
                line = self._line(item) or b""
            out.write(line)
            self._size += len(line)
            written += len(line)
            lines += 1
        if out is not None:
            out.flush()
            self._flushed = self._size
        return WriteResult(lines, written, rotations, len(items) - lines)

    def _rotate_earlier_capture(self) -> int:
        """An earlier capture's file is rotated away as this one opens; 1 if there was one."""
        if self.path.is_dir():  # never rename someone's directory away as a capture file
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(self.path))
        if self.path.exists() and self.path.stat().st_size > 0:
            self._rotate()
            return 1
        return 0

    def _open_fresh(self, head: bytes) -> IO[bytes]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = out = self.path.open("wb", buffering=_BUFFER_BYTES)
        self._flushed = 0
        out.write(head)
        self._size = len(head)
        return out

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.keep_files == 0:
            self.path.unlink(missing_ok=True)
            return
        for n in range(self.keep_files - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))

    def _drop_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_file()
