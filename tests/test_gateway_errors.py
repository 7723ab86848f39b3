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
    body = (FIXTURES / "vllm-error.json").read_bytes()
    assert normalise_error_body(body, status=400) is body


def test_legacy_flat_backend_error_becomes_openai_shape() -> None:
    legacy = orjson.loads((FIXTURES / "vllm-error-legacy.json").read_bytes())
    expected = orjson.loads((FIXTURES / "vllm-error.json").read_bytes())
    out = orjson.loads(normalise_error_body(orjson.dumps(legacy), status=400))
    assert out == expected


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
