"""`warmfleet conformance --engine URL`: do the gateway's ``tokens`` keys match the engine's cache?

The commonest silent failure of a prefix router is a key that does not match the engine's cache
key (chat template, tokenizer, block size): the hit rate is zero and nothing says so. This check
talks to a real vLLM server and:

1. reads the engine's block size (``vllm:cache_config_info{block_size}`` on ``/metrics``) and
   compares it with the gateway's;
2. renders a conversation with the gateway's tokenizer + chat template and compares the ids with
   the engine's own (``POST /tokenize`` with ``messages``); on a mismatch it tells a template
   difference (the engine tokenizes the gateway's rendered text to the same ids) from a
   tokenizer difference;
3. sends a multi-turn conversation (scripted assistant turns, ``ignore_eos``) and compares, turn
   by turn, the cached tokens the gateway predicts (leading full blocks already sent, capped at
   ``prompt - 1`` as vLLM recomputes the last token) with the engine's reported
   ``usage.prompt_tokens_details.cached_tokens``.

It passes when every turn agrees to within one block.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from warmfleet.core.errors import WarmfleetError
from warmfleet.edge import check_output_file
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.key_modes import KeyBuilder, key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

_BLOCK_SIZE_RE = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M)
_WORDS = (
    "cache block prefix router engine token fleet warm request reply model layer prompt "
    "replica gateway index event stream batch queue latency window signal vector memory "
    "kernel tensor shard node pool policy budget sample metric trace report "
    "alpha beta gamma delta north south east west river stone cloud light paper"
).split()


class ConformanceError(WarmfleetError):
    """The engine could not be queried."""


def filler_text(rng: random.Random, n_words: int) -> str:
    """Deterministic pseudo-text of ``n_words`` words (about 1.1 tokens a word here)."""
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


class EngineClient:
    """The few vLLM OpenAI-server calls the checks need (every call has a timeout)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")

    async def _json(self, method: str, path: str, body: object | None = None) -> Any:
        try:
            async with self.session.request(method, self.base_url + path, json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ConformanceError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
                return json.loads(text)
        except TimeoutError as err:
            raise ConformanceError(f"{method} {path}: no answer in time") from err
        except (aiohttp.ClientError, ValueError) as err:
            raise ConformanceError(f"{method} {path}: {type(err).__name__}: {err}") from err

    async def _field(self, method: str, path: str, key: str, body: object | None = None) -> Any:
        """``key`` of the JSON object the call answers; not a vLLM answer: ConformanceError."""
        data = await self._json(method, path, body)
        if not isinstance(data, dict) or key not in data:
            raise ConformanceError(
                f"{method} {path}: not a vLLM answer (no {key!r}): {str(data)[:200]}"
            )
        return data[key]

    async def model(self) -> tuple[str, str]:
        """(served model name, its ``root``: the local path vLLM loaded)."""
        models = await self._field("GET", "/v1/models", "data")
        first = models[0] if isinstance(models, list) and models else None
        if not isinstance(first, dict) or "id" not in first:
            raise ConformanceError(f"GET /v1/models: no model listed: {str(models)[:200]}")
        return str(first["id"]), str(first.get("root") or first["id"])

    async def block_size(self) -> int | None:
        try:
            async with self.session.get(self.base_url + "/metrics") as resp:
                text = await resp.text()
        except TimeoutError as err:
            raise ConformanceError("GET /metrics: no answer in time") from err
        except aiohttp.ClientError as err:
            raise ConformanceError(f"GET /metrics: {type(err).__name__}: {err}") from err
        match = _BLOCK_SIZE_RE.search(text)
        return int(match.group(1)) if match else None

    async def tokenize_chat(self, model: str, messages: list[dict[str, Any]]) -> list[int]:
        body = {"model": model, "messages": messages, "add_generation_prompt": True}
        return [int(t) for t in await self._field("POST", "/tokenize", "tokens", body)]

    async def tokenize_text(self, model: str, text: str) -> list[int]:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in await self._field("POST", "/tokenize", "tokens", body)]

    async def chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """(usage, latency in ms) of a non-streamed chat completion."""
        start = time.perf_counter()
        data = await self._json("POST", "/v1/chat/completions", body)
        return dict(data.get("usage") or {}), (time.perf_counter() - start) * 1000.0


def cached_tokens_of(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


@dataclass
class TurnResult:
    turn: int
    prompt_tokens_gateway: int
    prompt_tokens_engine: int
    predicted_cached_tokens: int
    engine_cached_tokens: int


@dataclass
class ConformanceReport:
    engine: str
    model: str
    gateway_block_size: int
    engine_block_size: int | None
    tokens_match: bool
    turns: list[TurnResult] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)

    @property
    def predicted_cached_tokens(self) -> int:
        return sum(t.predicted_cached_tokens for t in self.turns)

    @property
    def engine_cached_tokens(self) -> int:
        return sum(t.engine_cached_tokens for t in self.turns)

    @property
    def ok(self) -> bool:
        tolerance = self.engine_block_size or self.gateway_block_size
        return not self.causes and all(
            abs(t.predicted_cached_tokens - t.engine_cached_tokens) <= tolerance for t in self.turns
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            predicted_cached_tokens=self.predicted_cached_tokens,
            engine_cached_tokens=self.engine_cached_tokens,
            ok=self.ok,
        )
        return out


def predicted_cached(hashes: tuple[int, ...], seen: set[int], prompt_tokens: int, bs: int) -> int:
    """Leading blocks already sent (same chain), capped like vLLM (the last token is always
    recomputed, so a fully cached prompt reports ``floor((n - 1) / bs) * bs``)."""
    blocks = 0
    for h in hashes:
        if h not in seen:
            break
        blocks += 1
    return min(blocks * bs, max(0, (prompt_tokens - 1) // bs * bs))


async def _diagnose_tokens(
    client: EngineClient, tok: HfChatTokenizer, model: str, messages: list[dict[str, Any]]
) -> tuple[bool, list[str]]:
    ours = tok.encode_chat(messages)
    theirs = await client.tokenize_chat(model, messages)
    if ours == theirs:
        return True, []
    prefix = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    where = (
        f"first difference at token {prefix if prefix is not None else min(len(ours), len(theirs))}"
    )
    rendered = tok.render_chat(messages)
    if await client.tokenize_text(model, rendered) == theirs:
        return False, [f"tokenizer: same text, different ids ({where})"]
    return False, [f"template: the engine renders the conversation differently ({where})"]


async def run_conformance(
    engine_url: str,
    tokenizer_path: str | None = None,
    *,
    block_size: int | None = None,
    turns: int = 4,
    seed: int = 0,
    timeout_s: float = 120.0,
) -> ConformanceReport:
    """The three checks of the module docstring against ``engine_url``."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = EngineClient(session, engine_url)
        model, root = await client.model()
        tok = HfChatTokenizer.from_dir(tokenizer_path or root)
        engine_bs = await client.block_size()
        spec = KeySpec(mode="tokens", block_size=block_size or engine_bs or 16)
        keys = key_builder(spec, tok)
        report = ConformanceReport(engine_url, model, keys.block_size, engine_bs, True)
        if engine_bs is not None and engine_bs != keys.block_size:
            report.causes.append(
                f"block size: gateway hashes {keys.block_size}-token blocks, "
                f"engine uses {engine_bs}"
            )
        rng = random.Random(f"conformance/{seed}/{time.time_ns()}")  # fresh prefix every run
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "conformance " + filler_text(rng, 300)}
        ]
        seen: set[int] = set()
        for turn in range(turns):
            messages.append({"role": "user", "content": filler_text(rng, 120 + 40 * turn)})
            if turn == 0:
                report.tokens_match, causes = await _diagnose_tokens(client, tok, model, messages)
                report.causes.extend(causes)
            await _turn(client, keys, model, messages, seen=seen, report=report)
            messages.append({"role": "assistant", "content": filler_text(rng, 30)})
        return report


async def _turn(
    client: EngineClient,
    keys: KeyBuilder,
    model: str,
    messages: list[dict[str, Any]],
    *,
    seen: set[int],
    report: ConformanceReport,
) -> None:
    """One turn: the gateway's key and prediction beside the engine's answer, in ``report``;
    its blocks join ``seen`` (what the engine has cached by the next turn)."""
    body = {"model": model, "messages": messages, "max_tokens": 2, "ignore_eos": True}
    key = keys.key(parse_chat(body))
    usage, _latency_ms = await client.chat({**body, "temperature": 0.0})
    engine_prompt = int(usage.get("prompt_tokens") or 0)
    predicted = predicted_cached(key.block_hashes, seen, key.prompt_tokens, keys.block_size)
    report.turns.append(
        TurnResult(
            len(report.turns), key.prompt_tokens, engine_prompt, predicted, cached_tokens_of(usage)
        )
    )
    if engine_prompt != key.prompt_tokens and not report.causes:
        report.causes.append(
            f"prompt length: gateway {key.prompt_tokens} tokens, engine {engine_prompt}"
        )
    seen.update(key.block_hashes)


def conformance_command(
    engine: Annotated[str, typer.Option("--engine", help="vLLM server base URL.")],
    gateway_tokenizer: Annotated[
        str | None,
        typer.Option(help="Local model dir with tokenizer.json (default: the engine's root)."),
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(help="Gateway key block size (default: the engine's).")
    ] = None,
    turns: Annotated[int, typer.Option(min=2, max=32)] = 4,
    out: Annotated[
        Path | None, typer.Option(help="Write the report as JSON.", readable=False)
    ] = None,
) -> None:
    """Check that the gateway's token keys predict the engine's cached tokens."""
    try:
        if out is not None:
            check_output_file(out, "--out")  # before the engine is asked anything
        report = asyncio.run(
            run_conformance(engine, gateway_tokenizer, block_size=block_size, turns=turns)
        )
    except WarmfleetError as err:
        typer.echo(f"conformance: {err}", err=True)
        raise typer.Exit(2) from err
    for t in report.turns:
        typer.echo(
            f"turn {t.turn}: prompt {t.prompt_tokens_gateway}/{t.prompt_tokens_engine} tokens "
            f"(gateway/engine), cached predicted {t.predicted_cached_tokens}, "
            f"engine {t.engine_cached_tokens}"
        )
    for cause in report.causes:
        typer.echo(f"mismatch: {cause}")
    typer.echo(
        f"{'OK' if report.ok else 'FAIL'}: predicted {report.predicted_cached_tokens} cached "
        f"tokens, engine reported {report.engine_cached_tokens} "
        f"(block size {report.engine_block_size})"
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("conformance")(conformance_command)
