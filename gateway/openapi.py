"""`GET /openapi.json`: an OpenAPI 3.1 description of kvgate's own API.

It describes what the gateway itself serves and checks, not the backends' full OpenAI surface:
the completion bodies list the fields the gateway validates (gateway/schemas.py) with their
bounds, every other field is allowed and forwarded (`additionalProperties`), and every error is
OpenAI's body. The fuzz tests generate requests from it. Built once per app from the settings
that bound a request (the largest body, the most messages).
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
from aiohttp import web

from gateway.keys import SETTINGS
from gateway.schemas import RESPONSE_FORMATS, ROLES

JSON = "application/json"
OPENAPI_VERSION = "3.1.0"

_ERROR = {"$ref": "#/components/schemas/Error"}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.",
                                "schema": {"type": "string"}}}


def _error(description: str, *, retry_after: bool = False) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description,
                                "content": {JSON: {"schema": _ERROR}}}
    if retry_after:
        response["headers"] = _RETRY_AFTER
    return response


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description,
            "content": {JSON: {"schema": schema or {"type": "object"}}}}


_AUTH_ERRORS = {"401": _error("A missing or unknown API key (when keys are configured)."),
                "403": _error("A key that may not use this endpoint.")}

_COMPLETION_ERRORS = {
    "400": _error("A body the gateway refuses: not JSON, a field out of bounds, a bad "
                  "encoding or framing."),
    **_AUTH_ERRORS,
    "404": _error("An unknown model."),
    "413": _error("A body larger than `server.max_body_bytes`."),
    "429": _error("Overloaded or rate limited (the gateway's or the backend's).",
                  retry_after=True),
    "500": _error("The backend failed, relayed with its message."),
    "502": _error("No backend could be reached."),
    "503": _error("No healthy backend, the gateway draining, or the backend unavailable.",
                  retry_after=True),
    "504": _error("The backend did not answer in time."),
}


def _sampling(high: float) -> dict[str, Any]:
    return _number(0, high)


def _number(low: float, high: float) -> dict[str, Any]:
    return {"type": ["number", "null"], "minimum": low, "maximum": high}


def _completion_fields() -> dict[str, Any]:
    positive = {"type": ["integer", "null"], "minimum": 1}
    return {
        "model": {"type": "string", "minLength": 1},
        "stream": {"type": "boolean"},
        "stream_options": {"type": ["object", "null"], "additionalProperties": True,
                           "properties": {"include_usage": {"type": ["boolean", "null"]}}},
        "max_tokens": positive,
        "n": positive,
        "temperature": _sampling(2),
        "top_p": _sampling(1),
        "seed": {"type": ["integer", "null"]},
        "frequency_penalty": _number(-2, 2),
        "presence_penalty": _number(-2, 2),
        "logit_bias": {"type": ["object", "null"], "additionalProperties": _number(-100, 100)},
        "stop": {"oneOf": [{"type": ["string", "null"]},
                           {"type": "array", "items": {"type": "string"}}]},
        "user": {"type": ["string", "null"]},
    }


def _chat_fields() -> dict[str, Any]:
    return {
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0},
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "response_format": {"type": ["object", "null"], "required": ["type"],
                            "additionalProperties": True,
                            "properties": {"type": {"enum": list(RESPONSE_FORMATS)}}},
        "tools": {"type": ["array", "null"], "items": {"type": "object"}},
        "tool_choice": {"type": ["string", "object", "null"]},
    }


def _text_fields() -> dict[str, Any]:
    return {
        "logprobs": {"type": ["integer", "null"], "minimum": 0},
        "echo": {"type": ["boolean", "null"]},
        "best_of": {"type": ["integer", "null"], "minimum": 1},
        "suffix": {"type": ["string", "null"]},
    }


def _schemas(max_messages: int) -> dict[str, Any]:
    message = {
        "type": "object", "required": ["role"], "additionalProperties": True,
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": {"oneOf": [{"type": "string"}, {"type": "null"},
                                  {"type": "array", "items": {"type": "object"}}]},
        },
    }
    prompt = {"oneOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        {"type": "array", "minItems": 1, "items": {"type": "integer"}},
        {"type": "array", "minItems": 1,
         "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}},
    ]}
    return {
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {
                "type": "object", "required": ["message", "type"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "param": {"type": ["string", "null"]},
                               "code": {"type": ["string", "null"]}}}},
        },
        "ChatMessage": message,
        "ChatCompletionRequest": {
            "type": "object", "required": ["model", "messages"], "additionalProperties": True,
            "properties": {
                **_completion_fields(),
                "messages": {"type": "array", "minItems": 1, "maxItems": max_messages,
                             "items": {"$ref": "#/components/schemas/ChatMessage"}},
                **_chat_fields(),
            },
        },
        "CompletionRequest": {
            "type": "object", "required": ["model", "prompt"], "additionalProperties": True,
            "properties": {**_completion_fields(), "prompt": prompt, **_text_fields()},
        },
        "Model": {"type": "object", "required": ["id", "object"],
                  "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                                 "created": {"type": "integer"},
                                 "owned_by": {"type": "string"}}},
        "ModelList": {"type": "object", "required": ["object", "data"],
                      "properties": {"object": {"const": "list"},
                                     "data": {"type": "array",
                                              "items": {"$ref": "#/components/schemas/Model"}}}},
    }


def _completion(summary: str, schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {
            JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": "The completion: one JSON body, or with `stream: true` "
                    "server-sent events ending in `data: [DONE]` (a failure after the first "
                    "byte is an error event, then `[DONE]`).",
                    "content": {JSON: {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_COMPLETION_ERRORS,
        },
    }}


def _get(summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": responses}}


def document(*, max_messages: int) -> dict[str, Any]:
    """The OpenAPI document, bounded by the gateway's settings."""
    text = {"description": "Prometheus text exposition.",
            "content": {"text/plain": {"schema": {"type": "string"}}}}
    model_id = {"name": "model", "in": "path", "required": True,
                "schema": {"type": "string", "minLength": 1}}
    admin = {**_AUTH_ERRORS, "503": _error("The cache store does not answer.")}
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "kvgate", "version": "1",
                 "description": "An OpenAI-compatible gateway in front of a fleet of LLM "
                 "inference servers."},
        "paths": {
            "/v1/chat/completions": _completion("A chat completion.", "ChatCompletionRequest"),
            "/v1/completions": _completion("A text completion.", "CompletionRequest"),
            "/v1/models": _get("The models served and the routing aliases.", {
                "200": _json("The list.", {"$ref": "#/components/schemas/ModelList"}),
                **_AUTH_ERRORS}),
            "/v1/models/{model}": {"get": {
                "summary": "One model.", "parameters": [model_id],
                "responses": {"200": _json("The model.", {"$ref": "#/components/schemas/Model"}),
                              "404": _error("An unknown model."), **_AUTH_ERRORS}}},
            "/health": _get("Liveness: 200 while the process serves.",
                            {"200": _json("Alive.")}),
            "/ready": _get("Readiness: 200 while a backend is healthy and not draining.", {
                "200": _json("Ready."), "503": _json("Not ready.")}),
            "/metrics": _get("Prometheus metrics.", {"200": text, **_AUTH_ERRORS}),
            "/openapi.json": _get("This document.", {"200": _json("OpenAPI 3.1."),
                                                     **_AUTH_ERRORS}),
            "/admin/backends": _get("Every backend's state.", {
                "200": _json("The backends."), **_AUTH_ERRORS}),
            "/admin/cache": {
                **_get("The response cache's entries and counters.", {
                    "200": _json("The cache."), **admin}),
                "delete": {"summary": "Empties the response cache.", "responses": {
                    "200": _json("Flushed."), **admin}},
            },
            "/admin/cache/shadow": _get("The semantic cache's shadow report.", {
                "200": _json("The report."), **admin}),
        },
        "components": {
            "schemas": _schemas(max_messages),
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


@functools.cache
def _encoded(max_messages: int) -> bytes:
    return orjson.dumps(document(max_messages=max_messages))


async def openapi_json(request: web.Request) -> web.Response:
    body = _encoded(request.app[SETTINGS].server.max_messages)
    return web.Response(body=body, content_type=JSON)
