"""A stream whose usage event the gateway drops (it asked for usage, the client did not) reaches
the client as the backend would have sent it unasked: vLLM writes `system_fingerprint` on its
last event, which is the usage event when usage is asked for, so the finish event gets it.
Checked on real vLLM 0.32 streams (tests/data), however the bytes are split into reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.sse import StreamObserver
from tests.engines.readings import events

DATA = Path(__file__).resolve().parent / "data"
ASKED = (DATA / "vllm-0.32-chat-stream-usage.sse").read_bytes()  # include_usage: true
UNASKED = (DATA / "vllm-0.32-chat-stream.sse").read_bytes()  # the same request without it


def relayed(stream: bytes, reads: list[bytes], *, strip_usage: bool) -> bytes:
    observer = StreamObserver(lambda: 0.0, strip_usage=strip_usage)
    return b"".join(observer.feed(read) for read in reads) + observer.finish()


def split(stream: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [stream]
    if how == "by event":
        return [event + b"\n\n" for event in stream.split(b"\n\n") if event]
    size = {"by 7 bytes": 7, "by 1 byte": 1}[how]
    return [stream[i:i + size] for i in range(0, len(stream), size)]


def without_ids(stream: bytes) -> list[Any]:
    return [{k: v for k, v in event.items() if k not in ("id", "created")}
            if isinstance(event, dict) else event for event in events(stream)]


@pytest.mark.parametrize("how", ["whole", "by event", "by 7 bytes", "by 1 byte"])
def test_the_dropped_usage_events_fingerprint_goes_to_the_finish_event(how: str) -> None:
    out = relayed(ASKED, split(ASKED, how), strip_usage=True)
    assert without_ids(out) == without_ids(UNASKED)
    assert events(out)[-2]["system_fingerprint"] == orjson.loads(
        ASKED.split(b"\n\n")[-3][6:])["system_fingerprint"]


@pytest.mark.parametrize("how", ["whole", "by 7 bytes"])
def test_a_stream_whose_client_asked_for_usage_is_relayed_unchanged(how: str) -> None:
    assert relayed(ASKED, split(ASKED, how), strip_usage=False) == ASKED
