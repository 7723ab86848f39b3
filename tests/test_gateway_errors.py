"""Error bodies: gateway errors and backend errors all reach clients in OpenAI's shape."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import (
    BodyTooLarge,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    UpstreamTimeout,
    UpstreamUnreachable,
    normalise_error_body,
)
from tests.paths import FIXTURES

CONTEXT_TOO_LONG = ("This model's maximum context length is 8192 tokens. However, you requested "
                    "9000 tokens (8000 in the messages, 1000 in the completion). Please reduce "
                    "the length of the messages or completion.")


@pytest.mark.parametrize(
    ("error", "status", "type_"),
    [
        pytest.param(InvalidRequest("x", param="messages"), 400, "invalid_request_error",
                     id="bad request is 400"),
        pytest.param(ModelNotFound("x", param="model"), 404, "invalid_request_error",
                     id="unknown model is 404"),
        pytest.param(BodyTooLarge("x"), 413, "invalid_request_error", id="big body is 413"),
        pytest.param(UpstreamUnreachable("x"), 502, "upstream_error",
                     id="unreachable backend is 502"),
        pytest.param(NoHealthyBackend("x"), 503, "service_unavailable",
                     id="no healthy backend is 503"),
        pytest.param(UpstreamTimeout("x"), 504, "upstream_error", id="silent backend is 504"),
    ],
)
def test_gateway_errors_have_status_and_openai_body(
    error: GatewayError, status: int, type_: str
) -> None:
    assert error.status == status
    body = orjson.loads(error.body())
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == type_
    assert body["error"]["param"] == error.param


def test_openai_shaped_backend_error_passes_byte_identical() -> None:
    body = (b'{"error":{"message":"too long","type":"invalid_request_error","param":"messages",'
            b'"code":"context_length_exceeded"}}')
    assert normalise_error_body(body, status=400) is body


@pytest.mark.parametrize("fixture", ["vllm-error.json", "vllm-error-legacy.json"])
def test_vllms_error_shapes_become_openais(fixture: str) -> None:
    """vLLM's type (an exception's name) becomes OpenAI's for the status, and its numeric code,
    the status again, null: OpenAI's codes are strings."""
    vllm = (FIXTURES / fixture).read_bytes()
    out = orjson.loads(normalise_error_body(vllm, status=400))
    assert out == {"error": {"message": CONTEXT_TOO_LONG, "type": "invalid_request_error",
                             "param": None, "code": None}}


@pytest.mark.parametrize(("status", "type_"), [
    (400, "invalid_request_error"), (401, "invalid_request_error"), (403, "permission_error"),
    (404, "invalid_request_error"), (422, "invalid_request_error"), (429, "rate_limit_error"),
    (500, "server_error"), (502, "server_error"), (503, "service_unavailable"),
])
def test_a_backend_type_openai_does_not_use_becomes_the_type_of_its_status(
        status: int, type_: str) -> None:
    for body in (b'{"error": {"message": "m", "type": "SomeError", "code": 7}}',
                 b'{"message": "m"}', b"<html>m</html>"):
        error = orjson.loads(normalise_error_body(body, status=status))["error"]
        assert (error["type"], error["code"]) == (type_, None), body


def test_a_backend_types_and_string_codes_openai_uses_are_kept() -> None:
    body = b'{"error": {"message": "slow down", "type": "rate_limit_error", "code": "tokens"}}'
    error = orjson.loads(normalise_error_body(body, status=429))["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "tokens")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b"<html>Bad Gateway</html>", 502, "<html>Bad Gateway</html>",
                     id="non-JSON body is wrapped with its text"),
        pytest.param(b"", 503, "backend answered HTTP 503", id="empty body names the status"),
        pytest.param(b'{"detail": "nope"}', 422, "backend answered HTTP 422",
                     id="JSON that is no error object is wrapped"),
        pytest.param(b'{"error": "Input validation error", "error_type": "validation"}', 422,
                     "Input validation error", id="TGI's string error is lifted"),
    ],
)
def test_other_backend_error_bodies_are_wrapped(body: bytes, status: int, message: str) -> None:
    out = orjson.loads(normalise_error_body(body, status=status))
    assert out["error"]["message"] == message
    assert set(out["error"]) == {"message", "type", "param", "code"}
