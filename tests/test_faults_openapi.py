"""`GET /openapi.json`: an OpenAPI 3.1 description that schemathesis loads, naming every route
the gateway serves, with the bounds the gateway validates."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
import schemathesis

from gateway.app import create_app
from gateway.config import Settings
from gateway.openapi import document
from gateway.schemas import ROLES
from gateway.serve import running_gateway
from tests.paths import free_port


def settings() -> Settings:
    """A gateway whose one backend is a closed loopback port: the document needs none."""
    return Settings.model_validate({
        "server": {"port": 0, "max_messages": 123},
        "backends": [{"url": f"http://127.0.0.1:{free_port()}", "models": ["m"]}]})


async def served_document() -> dict[str, Any]:
    async with running_gateway(settings()) as url, aiohttp.ClientSession() as http, \
            http.get(url + "/openapi.json") as resp:
        assert resp.status == 200 and resp.content_type == "application/json"
        doc: dict[str, Any] = orjson.loads(await resp.read())
        return doc


async def test_the_gateway_publishes_a_document_schemathesis_loads() -> None:
    doc = await served_document()
    assert doc["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_dict(doc)
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert "POST /v1/chat/completions" in labels and "GET /openapi.json" in labels


def test_every_route_the_app_serves_is_described() -> None:
    app = create_app(settings())
    paths = document(max_messages=1)["paths"]
    served = {(route.method.lower(), route.resource.canonical)
              for route in app.router.routes()
              if route.resource is not None and route.method != "HEAD"}
    described = {(method, path) for path, item in paths.items() for method in item}
    assert served == described


@pytest.mark.parametrize(("where", "expected"), [
    pytest.param(("ChatCompletionRequest", "messages", "maxItems"), 123,
                 id="a conversation is bounded by server.max_messages"),
    pytest.param(("ChatCompletionRequest", "messages", "minItems"), 1,
                 id="a conversation has a message at least"),
    pytest.param(("ChatCompletionRequest", "temperature", "maximum"), 2,
                 id="temperature is 0 to 2"),
    pytest.param(("ChatCompletionRequest", "top_p", "maximum"), 1, id="top_p is 0 to 1"),
    pytest.param(("CompletionRequest", "max_tokens", "minimum"), 1,
                 id="max_tokens is 1 at least"),
])
async def test_request_bodies_carry_the_bounds_the_gateway_validates(
        where: tuple[str, str, str], expected: int) -> None:
    schema, field, bound = where
    doc = await served_document()
    assert doc["components"]["schemas"][schema]["properties"][field][bound] == expected


def test_messages_take_the_roles_the_gateway_accepts_and_errors_are_openai_shaped() -> None:
    schemas = document(max_messages=1)["components"]["schemas"]
    assert schemas["ChatMessage"]["properties"]["role"]["enum"] == list(ROLES)
    assert schemas["Error"]["properties"]["error"]["required"] == ["message", "type"]
    completions = document(max_messages=1)["paths"]["/v1/chat/completions"]["post"]
    for status in ("429", "503"):
        assert "Retry-After" in completions["responses"][status]["headers"]
