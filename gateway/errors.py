"""The gateway's error tree and OpenAI's error body.

Every failure the gateway reports itself is a `GatewayError`; the one error middleware
(gateway/app.py) turns it into `{"error": {"message", "type", "param", "code"}}` with its status.
Foreign exceptions are wrapped where they are caught, with `raise ... from exc`.

Backends answer errors in several shapes: OpenAI's nested one (vLLM, llama.cpp's
`{"error": {"code", "message", "type"}}`), older vLLM's flat one (`{"object": "error", "message":
..., "type": ..., "param": ..., "code": ...}`, also found nested as `{"error": {"object": "error",
...}}` inside streams), TGI's `{"error": "text", "error_type": ...}`, a bare `{"message":
"text"}`, and plain text (a proxy's HTML page). `normalise_error_body` turns each into OpenAI's
shape, the backend's message and HTTP status kept, so clients see one format: the `type` is one
of OpenAI's (a backend's own, such as vLLM's `BadRequestError` or TGI's `validation`, becomes the
type of its status) and the `code` a string or null, as OpenAI's (vLLM repeats the status there
as a number; the response's status line carries it).

Every 503 carries `Retry-After` (one second unless its maker knows better).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import orjson

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
# A 503 of the gateway's own that knows no better delay: a backend or the store may be back soon.
_RETRY_SOON: Mapping[str, str] = MappingProxyType({"Retry-After": "1"})


class GatewayError(Exception):
    """A failure the client should see as an OpenAI error body with `status`."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # Extra response headers, e.g. Retry-After on a 429; every 503 carries one.
        self.headers = _RETRY_SOON if self.status == 503 else _NO_HEADERS
        # The request's body was left unread or undecodable, so the connection cannot carry
        # another request: the answer says `Connection: close` rather than let the client
        # reuse a connection the server is closing.
        self.closes_connection = False

    def body(self) -> bytes:
        return error_body(self.message, type_=self.type, param=self.param, code=self.code)


class InvalidRequest(GatewayError):
    """The body is not JSON, or a field is missing or has the wrong type (`param` names it)."""

    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    """No API key, or one the gateway does not know (auth.keys)."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = MappingProxyType({"WWW-Authenticate": "Bearer"})


class PermissionDenied(GatewayError):
    """A valid key without the right: the admin views need an admin key."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class RateLimited(GatewayError):
    """The API key sent more requests than its `rpm` allows (gateway/ratelimit.py)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.headers = MappingProxyType({"Retry-After": str(retry_after_s)})


class ModelNotFound(GatewayError):
    """No configured backend serves the requested model, and no alias maps it to one that does."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class NoHealthyBackend(GatewayError):
    """Backends serve the model, but none of them is healthy right now."""

    status = 503
    type = "service_unavailable"
    code = "no_healthy_backend"


class CacheUnavailable(GatewayError):
    """The response cache's store does not answer (an admin view only: requests fail open)."""

    status = 503
    type = "service_unavailable"
    code = "cache_unavailable"


class UpstreamUnreachable(GatewayError):
    """Every attempt failed to connect, or the connection broke before the response began."""

    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(GatewayError):
    """The backend accepted the request but sent nothing within the first-byte timeout."""

    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    code = "internal_error"


def error_object(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_body(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(error_object(message, type_=type_, param=param, code=code))


_ERROR_FIELDS = ("message", "type", "param", "code")
# The error types OpenAI's API answers with, and the gateway's own for a backend failing.
ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error",
                         "rate_limit_error", "insufficient_quota", "server_error",
                         "service_unavailable", "upstream_error"})


def error_type_for(status: int) -> str:
    """The OpenAI error type of an HTTP status."""
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    if status == 503:
        return "service_unavailable"
    return "server_error"


def normalise_error(payload: object, *, status: int) -> dict[str, Any] | None:
    """OpenAI's `{"error": {...}}` for a decoded backend error payload; None if it is none.

    Accepts OpenAI's shape (returned with only the four fields), vLLM's legacy flat shape and the
    legacy nested one with an `object` field. A `type` OpenAI does not use becomes the type of
    the status (inside a stream, where the status line said 200, the status a numeric `code`
    names); a `code` or `param` that is not a string becomes null.
    """
    if not isinstance(payload, dict):
        return None
    inner = payload.get("error")
    if isinstance(inner, dict):
        source: dict[str, Any] = inner
    elif payload.get("object") == "error" and "message" in payload:
        source = payload
    elif isinstance(inner, str):
        # Some servers (TGI, llama.cpp proxies) answer {"error": "text", "error_type": ...}.
        source = {"message": inner, "type": payload.get("error_type")}
    elif inner is None and isinstance(payload.get("message"), str):  # a bare message object
        source = payload
    else:
        return None
    fields = {name: source.get(name) for name in _ERROR_FIELDS}
    if not isinstance(fields["message"], str):
        fields["message"] = str(fields["message"])
    code = fields["code"]
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        status = code
    if fields["type"] not in ERROR_TYPES:
        fields["type"] = error_type_for(status)
    for name in ("param", "code"):
        if not isinstance(fields[name], str):
            fields[name] = None
    return {"error": fields}


def normalise_error_body(body: bytes, *, status: int) -> bytes:
    """A backend's error body in OpenAI's shape: byte-identical when it already is, converted
    from vLLM's shapes, wrapped with the type of its status when it is not JSON at all (e.g. an
    HTML 502 page)."""
    kind = error_type_for(status)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()[:500] or f"backend answered HTTP {status}"
        return error_body(text, type_=kind)
    if isinstance(payload, str) and payload.strip():
        return error_body(payload.strip()[:500], type_=kind)
    normalised = normalise_error(payload, status=status)
    if normalised is None:
        return error_body(f"backend answered HTTP {status}", type_=kind)
    if normalised == payload:
        return body
    return orjson.dumps(normalised)
