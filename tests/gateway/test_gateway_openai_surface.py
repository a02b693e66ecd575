"""Issue 21: the OpenAI and vLLM routes clients reach for, through the gateway to the emulator:
``responses.create`` (whole and streamed), ``embeddings.create``, ``models.retrieve`` with the
official client; vLLM's ``/tokenize``, ``/detokenize`` and ``/version``; prefix routing of
Responses requests; bad bodies as the OpenAI error envelope."""

from __future__ import annotations

import base64
import json
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import openai
import pytest
from gateway_support import gateway_running

from warmfleet.emulator.config import build_spec
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.server import StartedApp

MODEL = "warmfleet-emulated"
INSTANCE = "x-warmfleet-instance"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass
class Http:
    """Raw requests to the gateway."""

    url: str
    session: aiohttp.ClientSession

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            headers = {k.lower(): v for k, v in resp.headers.items()}
            return Answer(resp.status, headers, await resp.read())

    async def post(self, path: str, **kwargs: Any) -> Answer:
        return await self.request("POST", path, **kwargs)


@dataclass
class Setup:
    gateway: StartedApp
    fleet: EmulatedFleet
    client: openai.AsyncOpenAI
    http: Http


def _doc(urls: list[str], strategy: str, limits: dict[str, Any]) -> dict[str, Any]:
    variant = {
        "name": "v1",
        "models": [MODEL],
        "routing": {"strategy": {"type": strategy}},
        "instances": [{"id": f"emu-{i}", "url": url} for i, url in enumerate(urls)],
    }
    spec = {
        "limits": limits,
        "health": {"interval_s": 0.2, "timeout_s": 0.2},
        "endpoints": [{"name": "main", "variants": [variant]}],
    }
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


@asynccontextmanager
async def _setup(
    instances: int, strategy: str, limits: dict[str, Any] | None = None
) -> AsyncIterator[Setup]:
    spec = build_spec(
        instances=instances,
        preset="tiny-cpu",
        block_size=16,
        kv_capacity_tokens=8192,
        speedup=20.0,
    )
    async with (
        EmulatedFleet(spec) as fleet,
        gateway_running(parse_gateway_config(_doc(fleet.urls, strategy, limits or {}))) as gateway,
        openai.AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="k", max_retries=0, timeout=60
        ) as client,
        aiohttp.ClientSession() as session,
    ):
        yield Setup(gateway, fleet, client, Http(gateway.url, session))


@pytest.fixture
async def one() -> AsyncIterator[Setup]:
    async with _setup(1, "round_robin") as setup:
        yield setup


@pytest.fixture
async def affinity() -> AsyncIterator[Setup]:
    async with _setup(3, "prefix_affinity") as setup:
        yield setup


async def test_responses_create_whole_and_streamed(one: Setup) -> None:
    client = one.client
    response = await client.responses.create(
        model=MODEL,
        instructions="You answer in short words.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "what is a cache?"}]}],
        max_output_tokens=6,
    )
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.output_text
    assert response.usage is not None
    assert 0 < response.usage.output_tokens <= 6
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "You answer in short words."

    stream = await client.responses.create(
        model=MODEL, input="tell me about warm caches", max_output_tokens=8, stream=True
    )
    kinds: list[str] = []
    deltas: list[str] = []
    final = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.done" in kinds
    assert final is not None
    assert deltas
    assert "".join(deltas) == final.output_text
    assert final.usage is not None
    assert final.usage.output_tokens == len(deltas)


async def test_responses_raw_headers_and_bad_bodies(one: Setup) -> None:
    raw = await one.client.responses.with_raw_response.create(model=MODEL, input="hi")
    assert raw.headers[INSTANCE] == "emu-0"
    assert raw.headers["x-warmfleet-reason"]
    with pytest.raises(openai.BadRequestError) as info:
        await one.client.responses.create(model=MODEL, input=cast(Any, 5))
    assert isinstance(info.value.body, dict)
    assert info.value.body.get("param") == "input"
    with pytest.raises(openai.NotFoundError):
        await one.client.responses.create(model="missing", input="hi")
    answer = await one.http.post("/v1/responses", data=b"[1, 2]")
    assert answer.status == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    answer = await one.http.post(
        "/v1/responses", json={"model": MODEL, "input": [{"type": "function_call"}]}
    )
    assert answer.status == 400
    assert answer.json()["error"]["param"] == "input[0].call_id"


async def test_embeddings_create(one: Setup) -> None:
    client = one.client
    default = await client.embeddings.create(model=MODEL, input=["warm", "cold start"])
    floats = await client.embeddings.create(
        model=MODEL, input=["warm", "cold start"], encoding_format="float"
    )
    assert [e.index for e in default.data] == [0, 1]
    assert len(default.data[0].embedding) == 64
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    for packed, plain in zip(default.data, floats.data, strict=True):
        assert packed.embedding == pytest.approx(plain.embedding, rel=1e-6, abs=1e-7)
    assert default.data[0].embedding != default.data[1].embedding
    again = await client.embeddings.create(model=MODEL, input=[1, 2, 3], dimensions=8)
    assert len(again.data[0].embedding) == 8
    same = await client.embeddings.create(
        model=MODEL, input=[[1, 2, 3]], dimensions=8, encoding_format="float"
    )
    assert same.data[0].embedding == pytest.approx(again.data[0].embedding, rel=1e-6)
    raw = await one.http.post(
        "/v1/embeddings", json={"model": MODEL, "input": "x", "encoding_format": "base64"}
    )
    vector = array("f", base64.b64decode(raw.json()["data"][0]["embedding"]))
    assert len(vector) == 64
    assert raw.headers[INSTANCE] == "emu-0"
    with pytest.raises(openai.BadRequestError) as info:
        await client.embeddings.create(model=MODEL, input=cast(Any, [{"a": 1}]))
    assert isinstance(info.value.body, dict)
    assert info.value.body.get("param") == "input"


async def test_models_retrieve_against_the_emulator(one: Setup) -> None:
    model = await one.client.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")


async def test_tokenize_detokenize_and_version(one: Setup) -> None:
    http = one.http
    text = "the warm cache keeps hot prefixes"
    tokens = await http.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert tokens.status == 200
    assert tokens.headers[INSTANCE] == "emu-0"
    ids = tokens.json()["tokens"]
    assert tokens.json()["count"] == len(ids) > 1
    back = await http.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert back.status == 200
    assert back.json()["prompt"] == "<|begin_of_text|>" + text
    chat = await http.post(
        "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}
    )  # no model: vLLM's is optional
    assert chat.status == 200
    assert chat.json()["count"] > 3
    version = await http.request("GET", "/version")
    assert version.status == 200
    assert version.json() == {"version": "warmfleet-emulator"}
    assert version.headers[INSTANCE] == "emu-0"
    head = await http.request("HEAD", "/version")
    assert head.status == 200
    assert head.content == b""
    missing = await http.post("/tokenize", json={"model": "missing", "prompt": "x"})
    assert missing.status == 404
    bad = await http.post("/detokenize", json={"model": 7, "tokens": [1]})
    assert bad.status == 400
    assert bad.json()["error"]["param"] == "model"
    broken = await http.post("/detokenize", data=b"{")
    assert broken.status == 400
    out_of_vocab = await http.post("/detokenize", json={"tokens": [10**9]})
    assert out_of_vocab.status == 400  # the instance's own 400, relayed


async def test_responses_sharing_a_long_prefix_stay_on_one_instance(affinity: Setup) -> None:
    """Each conversation (long instructions, then growing input) keeps its instance under
    prefix_affinity, however many conversations are interleaved."""
    placed: dict[int, set[str]] = {}
    for turn in range(3):
        for conversation in range(6):
            instructions = f"conversation {conversation}: " + " ".join(
                f"w{conversation}x{i}" for i in range(120)
            )
            items: list[Any] = [{"role": "user", "content": f"question {t}"} for t in range(turn)]
            items.append({"role": "user", "content": f"question {turn}"})
            raw = await affinity.client.responses.with_raw_response.create(
                model=MODEL, instructions=instructions, input=items, max_output_tokens=2
            )
            placed.setdefault(conversation, set()).add(raw.headers[INSTANCE])
    assert all(len(instances) == 1 for instances in placed.values()), placed
    assert len(set().union(*placed.values())) > 1  # and they are spread


async def test_big_bodies_are_parsed_on_the_body_worker() -> None:
    """Bodies over ``limits.offload_body_bytes`` take the worker path: the same answers, the
    same limits (a Responses body's input items count as messages)."""
    limits = {"offload_body_bytes": 0, "max_messages": 3, "max_prompts": 2}
    async with _setup(1, "prefix_affinity", limits) as setup:
        items = [{"role": "user", "content": f"turn {i}"} for i in range(3)]
        response = await setup.client.responses.create(
            model=MODEL, input=cast(Any, items), max_output_tokens=2
        )
        assert response.output_text
        vectors = await setup.client.embeddings.create(model=MODEL, input=["a", "b"])
        assert len(vectors.data) == 2
        tokens = await setup.http.post("/tokenize", json={"model": MODEL, "prompt": "x"})
        assert tokens.status == 200
        for path, body, param in [
            ("/v1/responses", {"model": MODEL, "input": [*items, items[0]]}, "input"),
            ("/v1/embeddings", {"model": MODEL, "input": ["a", "b", "c"]}, "input"),
            ("/tokenize", {"model": MODEL, "messages": [*items, items[0]]}, "messages"),
        ]:
            answer = await setup.http.post(path, json=body)
            assert answer.status == 400, (path, answer.content)
            assert answer.json()["error"]["param"] == param
            assert "limits." in answer.json()["error"]["message"]
