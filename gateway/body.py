"""A completion request's body, from the socket to the `Asked` the completion path reads.

- The bytes: a `Content-Encoding` the server cannot decode (an unknown one, or a corrupt gzip or
  deflate stream) is a 400 in OpenAI's shape, a body past `server.max_body_bytes` (after
  decompression) a 413.
- The JSON and its checks: a body past `WORKER_BYTES` is decoded, checked and turned into its
  prompt texts in a worker process, so that the event loop keeps relaying every other stream
  meanwhile; a smaller one on the loop, where the hop would cost more than the work. Not a
  thread: orjson holds the GIL while it decodes, and a thread would stall the loop the same.
  The body and the answer travel through shared memory in bounded steps
  (gateway/body_worker.py), for the same reason.
- The fields: checked one by one on the decoded dict (gateway/schemas.py), the conversation
  bounded by `server.max_messages`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.web_protocol import RequestPayloadError

from gateway.auth import KeyInfo
from gateway.body_worker import (
    Answer,
    answer,
    body_segment,
    discard_answer,
    discard_segment,
    parts_of,
    read_segment,
)
from gateway.errors import BodyTooLarge, GatewayError, InvalidRequest
from gateway.exchange import Asked, Exchange, prompt_of, prompt_text, tenant_of, user_turns
from gateway.keys import SETTINGS
from gateway.schemas import Fields, Validator, decode_object

WORKER_BYTES = 256 * 1024  # bodies past this are parsed off the event loop
ENCODINGS = frozenset(
    {"", "identity", "gzip", "x-gzip", "deflate"}
    | ({"br"} if HAS_BROTLI else set())
    | ({"zstd"} if HAS_ZSTD else set())
)


async def read_body(request: web.Request, max_body_bytes: int) -> bytes | bytearray:
    """The request's body, decoded from its Content-Encoding. InvalidRequest for an encoding
    that is unknown or does not decode, BodyTooLarge past `max_body_bytes`.

    Read as its chunks come, each step the event loop takes one chunk's worth of work: a big
    body of a declared length is copied chunk by chunk into one buffer of that length, others
    are joined once at the end (aiohttp's `read` grows one buffer, then copies it whole)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ENCODINGS:
        raise InvalidRequest(f"unsupported Content-Encoding {encoding[:40]!r}; send identity, "
                             f"{', '.join(sorted(ENCODINGS - {'', 'identity', 'x-gzip'}))}",
                             param="Content-Encoding")
    refused: GatewayError
    too_large = (f"the request body is larger than the limit of {max_body_bytes} bytes")
    length = request.content_length
    if length is not None and length > max_body_bytes:
        refused = BodyTooLarge(too_large)
        refused.closes_connection = True  # the body is not read
        raise refused
    chunks: list[bytes] = []
    size = 0
    whole = (bytearray(length) if length is not None and length > WORKER_BYTES
             and encoding in ("", "identity") else None)
    try:
        while chunk := await request.content.readany():
            end = size + len(chunk)
            if end > max_body_bytes:
                refused = BodyTooLarge(too_large)
                refused.closes_connection = True
                raise refused
            if whole is not None and end <= len(whole):
                whole[size:end] = chunk
            else:
                chunks.append(chunk)
            size = end
    except RequestPayloadError as exc:
        what = "its Content-Encoding" if encoding not in ("", "identity") else "its framing"
        refused = InvalidRequest(f"the request body could not be read: it does not decode as "
                                 f"{what}")
        # The rest of the body is not read, so the connection ends with this answer.
        refused.closes_connection = True
        raise refused from exc
    if whole is not None:  # aiohttp ends the body at its Content-Length
        return whole if not chunks else bytes(whole) + b"".join(chunks)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the completion path reads of a body, computed once (here or in the worker)."""

    data: dict[str, Any]
    fields: Fields
    conversation: str
    prompt_tokens: int | None
    prompt_text: str | None


@dataclass(frozen=True, slots=True)
class _Refused:
    """An InvalidRequest as the worker sends it back (the error itself does not pickle)."""

    message: str
    param: str | None


def parsed(raw: bytes | bytearray, validate: Validator) -> Parsed:
    """Decodes and checks `raw` (InvalidRequest naming the first wrong field)."""
    data = decode_object(raw)
    fields = validate(data)
    conversation, exact = prompt_of(data)
    return Parsed(data, fields, conversation, exact, prompt_text(data))


def _parsed_in_worker(segment: str, size: int, validate: Validator) -> Answer | _Refused:
    try:
        body = parsed(read_segment(segment, size), validate)
    except InvalidRequest as exc:
        return _Refused(exc.message, exc.param)
    return answer(body.fields, body.prompt_tokens,
                  (body.data, body.conversation, body.prompt_text))


def _unread(future: Future[Answer | _Refused]) -> None:
    """A worker's answer that came after its request went away."""
    if not future.cancelled() and future.exception() is None:
        discard_answer(future.result())


def _worker_started(gateway_pid: int) -> None:
    """The worker leaves Ctrl-C and SIGTERM to the gateway, which ends it, and ends with the
    gateway however that ends (a SIGKILL too): a worker left waiting for work would keep
    itself and the forkserver alive for good. (Its parent is the forkserver, so it watches
    the gateway's pid.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_ends_with, args=(gateway_pid,), daemon=True,
                     name="kvgate-parse-worker-watch").start()


def _ends_with(pid: int) -> None:
    try:
        watched = os.pidfd_open(pid)
    except (OSError, AttributeError):  # no pidfd (an old kernel): look once a second
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:
                pass
            time.sleep(1.0)
    select.select([watched], [], [])  # readable once the process has ended
    os._exit(0)


class BodyParser:
    """Parses bodies: a small one on the event loop, a big one in a worker process, started
    with the first big body and ended with the app. The loop then pays only for copying the
    bytes out and the results back (strings copy fast; a body of many objects that the checks
    refuse, past max_messages say, comes back as its small error, never as its tree)."""

    def __init__(self, threshold: int = WORKER_BYTES) -> None:
        self._threshold = threshold
        self._pool: ProcessPoolExecutor | None = None

    async def parse(self, raw: bytes | bytearray, validate: Validator) -> Parsed:
        if len(raw) <= self._threshold:
            return parsed(raw, validate)
        starting = self._pool is None
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("forkserver"),
                initializer=_worker_started, initargs=(os.getpid(),))
        pool = self._pool
        segment = await body_segment(raw)
        try:
            def submit() -> Future[Answer | _Refused]:
                return pool.submit(_parsed_in_worker, segment.name, len(raw), validate)

            # The first submission starts the worker and waits for it: from a thread.
            future = await asyncio.to_thread(submit) if starting else submit()
            try:
                reply = await asyncio.wrap_future(future)
            except asyncio.CancelledError:
                future.add_done_callback(_unread)
                raise
        except BrokenProcessPool:
            self._pool = None  # the worker died (killed, out of memory): a new one next time
            raise
        finally:
            discard_segment(segment)
        if isinstance(reply, _Refused):
            raise InvalidRequest(reply.message, param=reply.param)
        data, conversation, text = await parts_of(reply)
        return Parsed(data, reply.fields, conversation, reply.prompt_tokens, text)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


BODY_PARSER = web.AppKey("body_parser", BodyParser)


async def body_parsing(app: web.Application) -> AsyncIterator[None]:
    """The app's BodyParser, for its lifetime (a cleanup context)."""
    app[BODY_PARSER] = parser = BodyParser()
    try:
        yield
    finally:
        parser.close()


async def parse(request: web.Request, ex: Exchange, validate: Validator,
                key: KeyInfo | None) -> Asked:
    """The body, validated and read once; with API keys on, a request's tenant is its key's."""
    settings = request.app[SETTINGS]
    raw = await read_body(request, settings.server.max_body_bytes)
    body = await request.app[BODY_PARSER].parse(raw, validate)
    fields = body.fields
    tenant_header = settings.routing.tenant_header
    return Asked(
        raw=raw, data=body.data, model=fields.model, stream=fields.stream,
        include_usage=fields.include_usage, output_cap=fields.output_cap,
        choices=fields.n or 1, prompt_text=body.prompt_text, conversation=body.conversation,
        prompt_tokens=body.prompt_tokens, user_turns=user_turns(body.data),
        tenant=key.tenant if key is not None else tenant_of(ex.headers, tenant_header),
    )
