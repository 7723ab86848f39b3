"""Where the JSON access log goes when the CLI runs the gateway: stdout, one line per request,
written in batches.

logging's StreamHandler flushes after every record: one write system call per request, which
under load is most of what the access log costs. `BatchedLineHandler` keeps the formatted lines
and writes them together once `max_bytes` are pending, and at the latest `max_delay_s` after the
first pending line (a small flusher thread), on `flush()` and on `close()`. A line is therefore
never more than `max_delay_s` late, and nothing is lost at a clean shutdown (`logging.shutdown`
closes handlers at exit).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import TextIO

from gateway.telemetry.accesslog import LOGGER_NAME

MAX_BYTES = 64 * 1024
MAX_DELAY_S = 0.5


class BatchedLineHandler(logging.Handler):
    """A handler writing `message + "\\n"` per record to `stream`, in batches. Thread-safe."""

    def __init__(
        self, stream: TextIO, *, max_bytes: int = MAX_BYTES, max_delay_s: float = MAX_DELAY_S
    ) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self._stream = stream
        self._max_bytes = max_bytes
        self._max_delay = max_delay_s
        self._pending: list[str] = []
        self._size = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flusher = threading.Thread(target=self._run, name="kvgate-access-log", daemon=True)
        self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            first = not self._pending
            self._pending.append(line)
            self._size += len(line)
            full = self._size >= self._max_bytes
            if full:
                self._write_locked()
        if first and not full:
            self._wake.set()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_locked()

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._flusher is not threading.current_thread():
            self._flusher.join()
        self.flush()
        super().close()

    def _write_locked(self) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        self._size = 0
        # stdout closed or gone: the log must not stop serving
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
            self._stream.flush()

    def _run(self) -> None:
        """Waits for a first pending line, then flushes `max_delay_s` later."""
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopping.wait(self._max_delay):
                return
            self.flush()


def configure_access_log(level: str, stream: TextIO | None = None) -> BatchedLineHandler:
    """The "kvgate.access" logger writes JSON lines to `stream` (default stdout) at `level`: with
    a level above INFO no access line is even built. Its lines do not reach the root handlers."""
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        if isinstance(old, BatchedLineHandler):
            logger.removeHandler(old)
            old.close()
    handler = BatchedLineHandler(stream if stream is not None else sys.stdout)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler
