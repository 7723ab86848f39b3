"""Backends' error bodies in OpenAI's shape with the backend's message kept, whatever the
server: OpenAI's type for the status where the backend's is its own, a string code or null;
every 503 the gateway makes itself carries Retry-After."""

from __future__ import annotations

import orjson
import pytest

import gateway.admission  # noqa: F401 - its errors are GatewayErrors too
from gateway.errors import GatewayError, NoHealthyBackend, normalise_error_body
from tests.paths import FIXTURES

SERVERS = [
    pytest.param((FIXTURES / "vllm-error-legacy.json").read_bytes(), 400,
                 {"message": "This model's maximum context length is 8192 tokens. However, you "
                  "requested 9000 tokens (8000 in the messages, 1000 in the completion). Please "
                  "reduce the length of the messages or completion.",
                  "type": "invalid_request_error", "param": None, "code": None},
                 id="vLLM's flat object error"),
    pytest.param(b'{"error":"Input validation error: `inputs` must have less than 4096 tokens",'
                 b'"error_type":"validation"}', 422,
                 {"message": "Input validation error: `inputs` must have less than 4096 tokens",
                  "type": "invalid_request_error", "param": None, "code": None},
                 id="TGI's string error and error_type"),
    pytest.param(b'{"error":{"code":400,"message":"the request exceeds the available context '
                 b'size","type":"exceed_context_size_error","n_prompt_tokens":5000}}', 400,
                 {"message": "the request exceeds the available context size",
                  "type": "invalid_request_error", "param": None, "code": None},
                 id="llama.cpp's nested error"),
    pytest.param(b"Service Unavailable\n", 503,
                 {"message": "Service Unavailable", "type": "service_unavailable", "param": None,
                  "code": None},
                 id="plain text"),
    pytest.param(b'"model is loading"', 503,
                 {"message": "model is loading", "type": "service_unavailable", "param": None,
                  "code": None},
                 id="a JSON string"),
    pytest.param(b'{"message":"rate limited, slow down"}', 429,
                 {"message": "rate limited, slow down", "type": "rate_limit_error",
                  "param": None, "code": None},
                 id="a bare message object"),
]


@pytest.mark.parametrize(("body", "status", "error"), SERVERS)
def test_a_backend_error_is_openai_shaped_with_its_message(body: bytes, status: int,
                                                           error: dict[str, object]) -> None:
    assert orjson.loads(normalise_error_body(body, status=status)) == {"error": error}


def _subclasses(cls: type[GatewayError]) -> list[type[GatewayError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


UNAVAILABLE = [c for c in _subclasses(GatewayError) if c.status == 503]


@pytest.mark.parametrize("kind", UNAVAILABLE, ids=[c.__name__ for c in UNAVAILABLE])
def test_every_503_of_the_gateway_carries_retry_after(kind: type[GatewayError]) -> None:
    assert int(kind("unavailable").headers["Retry-After"]) >= 1


def test_503s_are_found() -> None:
    assert NoHealthyBackend in UNAVAILABLE and len(UNAVAILABLE) >= 3
