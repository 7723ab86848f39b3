"""A completion request's body, from the socket to the `Asked` the completion path reads.

- The bytes: a `Content-Encoding` the server cannot decode (an unknown one, or a corrupt gzip or
  deflate stream) is a 400 in OpenAI's shape, a body past `server.max_body_bytes` (after
  decompression) a 413.
- The JSON: a big body is decoded in a worker thread, so that the event loop keeps relaying
  every other stream while it is parsed; a small one on the loop, where a thread hop would cost
  more than the decoding.
- The fields: checked one by one on the decoded dict (gateway/schemas.py), the conversation
  bounded by `server.max_messages`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.web_protocol import RequestPayloadError

from gateway.auth import KeyInfo
from gateway.errors import BodyTooLarge, InvalidRequest
from gateway.exchange import Asked, Exchange, prompt_of, prompt_text, tenant_of, user_turns
from gateway.keys import SETTINGS
from gateway.schemas import Validator, decode_object

THREAD_DECODE_BYTES = 1024 * 1024  # bodies above this are decoded off the event loop
ENCODINGS = frozenset(
    {"", "identity", "gzip", "x-gzip", "deflate"}
    | ({"br"} if HAS_BROTLI else set())
    | ({"zstd"} if HAS_ZSTD else set())
)


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The request's body, decoded from its Content-Encoding. InvalidRequest for an encoding
    that is unknown or does not decode, BodyTooLarge past `max_body_bytes`."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ENCODINGS:
        raise InvalidRequest(f"unsupported Content-Encoding {encoding[:40]!r}; send identity, "
                             f"{', '.join(sorted(ENCODINGS - {'', 'identity', 'x-gzip'}))}",
                             param="Content-Encoding")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(
            f"the request body is larger than the limit of {max_body_bytes} bytes") from exc
    except RequestPayloadError as exc:
        what = "its Content-Encoding" if encoding not in ("", "identity") else "its framing"
        raise InvalidRequest(f"the request body could not be read: it does not decode as "
                             f"{what}") from exc


async def decode(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw` (gateway/schemas.py's `decode_object`), off the loop when big."""
    if len(raw) > THREAD_DECODE_BYTES:
        return await asyncio.to_thread(decode_object, raw)
    return decode_object(raw)


async def parse(request: web.Request, ex: Exchange, validate: Validator,
                key: KeyInfo | None) -> Asked:
    """The body, validated and read once; with API keys on, a request's tenant is its key's."""
    settings = request.app[SETTINGS]
    raw = await read_body(request, settings.server.max_body_bytes)
    data = await decode(raw)
    fields = validate(data)
    tenant_header = settings.routing.tenant_header
    conversation, exact = prompt_of(data)
    return Asked(
        raw=raw, data=data, model=fields.model, stream=fields.stream,
        include_usage=fields.include_usage, output_cap=fields.output_cap,
        choices=fields.n or 1, prompt_text=prompt_text(data), conversation=conversation,
        prompt_tokens=exact, user_turns=user_turns(data),
        tenant=key.tenant if key is not None else tenant_of(ex.headers, tenant_header),
    )
