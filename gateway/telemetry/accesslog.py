"""The structured access log: one JSON line per (sampled) request on the "kvgate.access" logger.

Where the lines go is the logging configuration's business (the CLI attaches a handler); when the
logger is not enabled for INFO nothing is built at all. The prompt text is written only when the
settings explicitly allow it. Sampling draws from an injected `random.Random`, and only when the
rate is strictly between 0 and 1.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import orjson

from gateway.telemetry.outcome import RequestOutcome
from gateway.telemetry.timing import RequestTiming

LOGGER_NAME = "kvgate.access"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class AccessLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        sample_rate: float,
        rng: random.Random,
        include_prompt: bool,
        wall_clock: Callable[[], float],
    ) -> None:
        self._logger = logger
        self._rate = sample_rate
        self._rng = rng
        self._include_prompt = include_prompt
        self._wall_clock = wall_clock

    def sampled(self) -> bool:
        rate = self._rate
        if rate >= 1.0:
            return True
        if rate <= 0.0:
            return False
        return self._rng.random() < rate

    def log(self, timing: RequestTiming, outcome: RequestOutcome, trace_id: str | None) -> None:
        logger = self._logger
        if not self.sampled() or not logger.isEnabledFor(logging.INFO):
            return
        # `logger.info` without its caller lookup (a walk up the stack for file and line, the
        # dearest part of a log call): the caller of every access-log line is this method.
        record = logger.makeRecord(
            logger.name, logging.INFO, __file__, 0, self.line(timing, outcome, trace_id), (),
            None, "log",
        )  # fmt: skip
        logger.handle(record)

    def line(self, timing: RequestTiming, outcome: RequestOutcome, trace_id: str | None) -> str:
        record: dict[str, object] = {
            "ts": round(self._wall_clock(), 3),
            "request_id": outcome.request_id,
            "trace_id": trace_id,
            "tenant": outcome.tenant,
            "operation": outcome.operation,
            "model": outcome.request_model,
            "served_model": outcome.response_model,
            "backend": outcome.backend,
            "policy": outcome.policy,
            "cache": outcome.cache,
            "status": outcome.status,
            "error": outcome.error_type,
            "stream": outcome.stream,
            "admission": outcome.admission,
            "rejection_reason": outcome.rejection_reason,
            "input_tokens": outcome.input_tokens,
            "output_tokens": outcome.output_tokens,
            "queue_ms": _ms(timing.queue_s),
            "ttft_ms": _ms(timing.ttft_s),
            # A JSON answer arrives whole: time per output token is a streaming figure.
            "tpot_ms": _ms(timing.tpot_s(outcome.output_tokens)) if outcome.stream else None,
            "duration_ms": _ms(timing.duration_s),
        }
        if self._include_prompt and outcome.prompt is not None:
            record["prompt"] = outcome.prompt
        return orjson.dumps(record).decode()
