"""The stream watch's two clocks on a manual clock: a backend silent for the idle timeout ends
the stream, a client write blocked for the write timeout cuts the client off, and time spent
blocked on the client is never the backend's silence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from gateway.stream_watch import StreamIdle, StreamStopped, StreamWatch

IDLE_S = 0.5
WRITE_S = 60.0


@dataclass
class Timer:
    when: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ManualLoop:
    now: float = 0.0
    timers: list[Timer] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        self.timers.append(timer)
        return timer

    def run_until(self, until: float) -> None:
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when <= until]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.now = until


@dataclass
class Body:
    errors: list[BaseException] = field(default_factory=list)

    def set_exception(self, exc: BaseException) -> None:
        self.errors.append(exc)


@dataclass
class Watched:
    loop: ManualLoop
    body: Body
    watch: StreamWatch
    cut: list[float]


def watched() -> Watched:
    loop, body, cut = ManualLoop(), Body(), []
    watch = StreamWatch(cast(Any, loop), cast(Any, body), idle_s=IDLE_S, write_s=WRITE_S,
                        on_client_stuck=lambda: cut.append(loop.now))
    return Watched(loop, body, watch, cut)


def test_a_backend_silent_for_the_idle_timeout_ends_the_stream() -> None:
    w = watched()
    w.loop.run_until(IDLE_S - 0.01)
    assert w.body.errors == []
    w.loop.run_until(IDLE_S + 0.01)
    assert [type(e) for e in w.body.errors] == [StreamIdle]
    assert w.cut == []


def test_bytes_that_keep_coming_keep_the_stream_going() -> None:
    w = watched()
    for step in range(1, 40):
        w.loop.run_until(step * IDLE_S / 2)
        w.watch.read_since = w.loop.now
    assert w.body.errors == []


@pytest.mark.parametrize("blocked_s", [IDLE_S * 3, WRITE_S - 1],
                         ids=["longer than the idle timeout", "just under the write timeout"])
def test_a_write_blocked_on_the_client_is_never_the_backends_silence(blocked_s: float) -> None:
    w = watched()
    w.watch.write_since = w.loop.now
    w.loop.run_until(blocked_s)
    w.watch.write_since = None
    w.watch.read_since = w.loop.now
    assert (w.body.errors, w.cut) == ([], [])
    w.loop.run_until(blocked_s + IDLE_S + 0.01)  # then silence: the idle clock starts afresh
    assert [type(e) for e in w.body.errors] == [StreamIdle]


def test_a_write_blocked_for_the_write_timeout_cuts_the_client_off() -> None:
    w = watched()
    w.loop.run_until(0.1)
    w.watch.write_since = w.loop.now
    w.loop.run_until(0.1 + WRITE_S + 1)
    assert w.cut == [pytest.approx(0.1 + WRITE_S)]
    assert w.watch.client_stuck and w.body.errors == []


def test_after_the_silence_the_writes_of_the_streams_end_are_still_watched() -> None:
    w = watched()
    w.loop.run_until(IDLE_S + 0.01)
    w.watch.write_since = w.loop.now  # the error event, to a client that reads nothing
    w.loop.run_until(IDLE_S + 3 * WRITE_S)
    assert len(w.cut) == 1 and [type(e) for e in w.body.errors] == [StreamIdle]


def test_stop_ends_the_stream_with_its_message_and_close_ends_the_watch() -> None:
    w = watched()
    w.watch.stop("shutting down")
    assert [str(e) for e in w.body.errors] == ["shutting down"]
    assert isinstance(w.body.errors[0], StreamStopped)
    w.watch.close()
    w.loop.run_until(10 * WRITE_S)
    assert len(w.body.errors) == 1 and w.cut == []
