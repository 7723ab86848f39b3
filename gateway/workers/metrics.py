"""One `/metrics` for the host: the worker that answers a scrape asks the others for their
figures (`Epochs`, in the host's segment), each writes its exposition to the host's metrics
directory, and the answering worker merges them into its own (`HostMetrics`).

The merge (`merge`, pure): counters, histograms and every untyped sample are summed over the
workers; so are gauges of a worker's own state (its queue depth, its client connections). A
gauge labelled with a backend (`kvgate_backend`) reads state every worker shares (the host's
ledger and scrapes), so the answering worker's own value is the host's and is kept. A family or a
sample only another worker has is added. A restarted worker's counters start again from 0, as a
restarted process's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger("kvgate.workers")

CHECK_S = 0.01  # how often the answering worker looks whether the others have written
WAIT_S = 0.5
SHARED_LABEL = 'kvgate_backend="'
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class _Family:
    name: str
    kind: str = "untyped"
    header: list[str] = field(default_factory=list)
    samples: dict[str, float] = field(default_factory=dict)  # "name{labels}" -> value


def parse(text: str) -> dict[str, _Family]:
    """An exposition's families in order; samples before any TYPE line form their own."""
    families: dict[str, _Family] = {}
    current: _Family | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                current = families.setdefault(name, _Family(name))
                current.header.append(line)
                if parts[1] == "TYPE" and len(parts) == 4:
                    current.kind = parts[3].strip()
            continue
        key, _, value = line.rpartition(" ")
        if not key:
            continue
        if current is None:
            current = families.setdefault("", _Family(""))
        try:
            current.samples[key] = float(value)
        except ValueError:
            continue
    return families


def _summed(family: _Family, key: str) -> bool:
    return family.kind != "gauge" or SHARED_LABEL not in key


def merge(own: str, others: Iterable[str]) -> str:
    """`own` exposition with `others`' merged in (module docstring)."""
    merged = parse(own)
    for text in others:
        for name, theirs in parse(text).items():
            family = merged.get(name)
            if family is None:
                merged[name] = _Family(name, theirs.kind, list(theirs.header),
                                       dict(theirs.samples))
                continue
            for key, value in theirs.samples.items():
                if key not in family.samples:
                    family.samples[key] = value
                elif _summed(family, key):
                    family.samples[key] += value
    lines: list[str] = []
    for family in merged.values():
        lines.extend(family.header)
        lines.extend(f"{key} {_number(value)}" for key, value in family.samples.items())
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


class Epochs:
    """Who asked for the workers' figures, and who wrote them since: 64-bit cells in the host's
    segment, the first the epoch last asked for, then the one each worker last wrote for."""

    __slots__ = ("_cells", "workers")

    def __init__(self, buf: memoryview, workers: int, offset: int = 0) -> None:
        self._cells = buf[offset : offset + self.nbytes(workers)].cast("q")
        self.workers = workers

    @staticmethod
    def nbytes(workers: int) -> int:
        return (1 + workers) * 8

    def ask(self) -> int:
        """A new epoch to write for (two workers asking at once may ask for the same one)."""
        epoch = self._cells[0] + 1
        self._cells[0] = epoch
        return epoch

    @property
    def asked(self) -> int:
        return self._cells[0]

    def wrote(self, worker: int, epoch: int) -> None:
        self._cells[1 + worker] = epoch

    def written(self, worker: int) -> int:
        return self._cells[1 + worker]

    def release(self) -> None:
        self._cells.release()


class HostMetrics:
    """A worker's part: writing its exposition when asked, merging the others' into its
    answers. Nothing is rendered while nobody scrapes: the worker answering `/metrics` asks for
    a new epoch; every worker checks at every read of its feed (`check`, every half poll
    interval) whether one was asked that it has not written yet, and writes its exposition
    then; the answering worker waits, at most `wait_s` (a worker that died or hangs does not
    hold the scrape up), for every other worker to have written, and merges their files."""

    def __init__(self, directory: Path, worker: int, render: Callable[[], bytes],
                 epochs: Epochs, wait_s: float = WAIT_S) -> None:
        self.directory = directory
        self._wait_s = wait_s
        self.worker = worker
        self._render = render
        self._epochs = epochs

    def path_of(self, worker: int) -> Path:
        return self.directory / f"worker-{worker}.prom"

    def write(self) -> None:
        """Writes this worker's exposition whole (a reader never sees half of it)."""
        epoch = self._epochs.asked
        path = self.path_of(self.worker)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(self._render())
        os.replace(tmp, path)
        self._epochs.wrote(self.worker, epoch)

    def check(self) -> None:
        """Writes when an epoch was asked that this worker has not written for."""
        if self._epochs.asked > self._epochs.written(self.worker):
            try:
                self.write()
            except OSError as exc:
                log.warning("worker %d: cannot write its metrics: %s", self.worker, exc)

    def others(self) -> list[str]:
        own = self.path_of(self.worker).name
        texts: list[str] = []
        for path in sorted(self.directory.glob("worker-*.prom")):
            if path.name != own:
                with contextlib.suppress(OSError):
                    texts.append(path.read_text())
        return texts

    async def fresh_others(self) -> list[str]:
        epochs = self._epochs
        epoch = epochs.ask()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        peers = [w for w in range(epochs.workers) if w != self.worker]
        while any(epochs.written(w) < epoch for w in peers) and loop.time() < deadline:
            await asyncio.sleep(CHECK_S)
        return self.others()

    async def writing(self, app: web.Application) -> AsyncIterator[None]:
        """A cleanup context: writes once at start (a restarted worker's figures start again
        from 0); then `check` (the worker's feed calls it at every read) writes when asked."""
        try:
            self.write()
        except OSError as exc:
            log.warning("worker %d: cannot write its metrics: %s", self.worker, exc)
        yield

    def middleware(self) -> Middleware:
        @web.middleware
        async def host_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path != "/metrics":
                return await handler(request)
            others = await self.fresh_others()
            response = await handler(request)
            if (response.status != 200 or not isinstance(response, web.Response)
                    or not isinstance(response.body, bytes)):
                return response
            response.body = merge(response.body.decode(), others).encode()
            return response

        return host_metrics
