"""Acceptance 3: the official ``openai`` client works against the gateway (real Router)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from gateway_process_support import ThreadedGateway
from gateway_support import (
    MODEL,
    backends_running,
    gateway_config,
    gateway_doc,
    gateway_running,
)


@pytest.mark.parametrize(
    "strategy", ["round_robin", "prefix_affinity", "least_outstanding_requests"]
)
async def test_openai_client_chat_and_completions(strategy: str) -> None:
    async with (
        backends_running("a", "b", chunks=5) as backends,
        gateway_running(gateway_config(backends, strategy={"type": strategy})) as gw,
        openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="test-key", max_retries=0) as client,
    ):
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert chat.choices[0].message.content is not None
        assert chat.choices[0].message.content.startswith("hello from ")

        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream]
        assert len(pieces) == 5
        assert pieces[0] is not None
        backend = pieces[0].split("-")[0]
        assert pieces == [f"{backend}-{i} " for i in range(5)]

        completion = await client.completions.create(model=MODEL, prompt="once upon", max_tokens=4)
        assert completion.choices[0].text.startswith("hello from ")

        cstream = await client.completions.create(model=MODEL, prompt=[1, 2, 3], stream=True)
        texts = [c.choices[0].text async for c in cstream]
        assert len(texts) == 5

        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
        assert raw.headers["x-warmfleet-instance"] in {"a", "b"}
        assert raw.headers["x-warmfleet-reason"]

        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]

        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="missing", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL, messages=[])
        assert info.value.body is not None


def test_openai_sync_client_streaming() -> None:
    """The synchronous client, against a gateway running in a background thread."""
    with ThreadedGateway(gateway_doc, ["a", "b"]) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        with client:
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert len(list(stream)) == 4
            out = client.completions.create(model=MODEL, prompt="p")
            assert out.choices[0].text.startswith("hello from")


async def test_openai_client_retrieves_a_model_by_id() -> None:
    """``models.retrieve`` (``GET /v1/models/{id}``) answers from the instances' model lists, ids
    with a slash included; an unknown id is the client's NotFoundError."""
    org_model = "meta-llama/Llama-3.1-8B"
    async with backends_running("a") as backends:
        backends[0].models = [MODEL, org_model]
        variants: list[dict[str, Any]] = [
            {
                "name": "v1",
                "models": [MODEL, org_model],
                "routing": {"strategy": {"type": "round_robin"}},
                "instances": [{"id": b.name, "url": b.url} for b in backends],
            }
        ]
        async with (
            gateway_running(gateway_config(backends, variants=variants)) as gw,
            openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client,
        ):
            model = await client.models.retrieve(MODEL)
            assert (model.id, model.object) == (MODEL, "model")
            assert (await client.models.retrieve(org_model)).id == org_model
            with pytest.raises(openai.NotFoundError) as info:
                await client.models.retrieve("missing")
            assert "missing" in str(info.value)
