"""What the gateway learns about one completion request on its way through, read once at its end.

The telemetry middleware (gateway/observe.py) creates an `Observation` at arrival and stores it on
the aiohttp request under `keys.OBSERVATION` (its `timing` also under `keys.TIMING`). Each stage
writes what it knows into it, in place:

- the handler: `request_model`, `stream` and, only when prompt logging is on, `prompt`
  (`note_request`);
- admission: `timing.queue_start` / `timing.queue_end`, `admission` and `rejection_reason`;
- the cache: `timing.cache_start` / `timing.cache_end` and `cache`, and on a hit
  `response_model`, `usage` and (streams) `timing.first_byte`; small-model routing:
  `small_model`;
- the proxy: `timing.route_*`, `dispatch`, `connected`, `first_byte`, and its `Outcome`.

The middleware turns it into one `RequestOutcome` when the request ends, on every path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.proxy import Outcome
from gateway.telemetry import RequestTiming, RequestTrace
from gateway.telemetry.outcome import CACHE_BYPASS


@dataclass(slots=True)
class Observation:
    operation: str  # gen_ai.operation.name: "chat" or "text_completion"
    timing: RequestTiming
    trace: RequestTrace
    keep_prompt: bool = False  # prompt logging is on: `note_request` keeps the prompt text
    request_model: str | None = None  # the model the client asked for, once the body is valid
    stream: bool = False
    tenant: str | None = None
    cache: str = CACHE_BYPASS  # "bypass" while no cache looked the request up
    admission: str | None = None  # "admitted" | "queued" | "rejected"; None = not reached
    rejection_reason: str | None = None
    small_model: bool | None = None
    model_reason: str | None = None  # small-model routing's reason (x-kvgate-model-reason)
    prompt: str | None = None
    # A cache hit's: the model that produced the replayed answer, and its usage.
    response_model: str | None = None
    usage: dict[str, Any] | None = None
    outcome: Outcome | None = None  # the proxy's report, when the request got that far


def note_request(observation: Observation, model: str, stream: bool, body: dict[str, Any]) -> None:
    """The handler's part, once the body is valid."""
    observation.request_model = model
    observation.stream = stream
    if observation.keep_prompt:
        observation.prompt = prompt_text(body)


def prompt_text(body: dict[str, Any]) -> str | None:
    """The prompt as text: chat messages' text (string contents and text parts) one per line, or
    a completion's prompt string(s). None when there is no text (token ids)."""
    pieces: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                pieces.append(content)
            elif isinstance(content, list):
                pieces.extend(
                    part["text"]
                    for part in content
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        pieces.append(prompt)
    elif isinstance(prompt, list):
        pieces.extend(p for p in prompt if isinstance(p, str))
    return "\n".join(pieces) if pieces else None
