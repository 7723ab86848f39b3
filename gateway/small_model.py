"""The handler's side of small-model routing: read the request and the large model's state,
let `routing.model_select.select` choose, note the choice for telemetry.

The choice is stamped on the response as `x-kvgate-model-reason` (`easy`, `overflow`, or what
kept it on the large model: `long_prompt`, `long_output`, `many_turns`, `hard_marker`,
`small_unavailable`, `large_free`); `x-kvgate-model` names the model that served it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.admission import GATE
from gateway.keys import CLOCK, FLEET, OBSERVATION, SETTINGS
from gateway.observation import prompt_text
from routing.model_select import Ask, Selection, SmallModelRoute, large_busy, select


def choose(request: web.Request, route: SmallModelRoute, body: Mapping[str, Any],
           max_tokens: int | None) -> Selection:
    app = request.app
    fleet, now = app[FLEET], app[CLOCK]()
    messages = body.get("messages")
    turns = 1
    if isinstance(messages, list):
        turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")
    ask = Ask(text=prompt_text(dict(body)) or "", max_tokens=max_tokens, turns=turns)
    busy = False
    if route.mode == "overflow":
        queued = app[GATE].dispatcher.queue_depths().get(route.large, 0)
        busy = large_busy(fleet.candidates(route.large, now), queued,
                          app[SETTINGS].routing.high_water)
    selection = select(route, ask, small_available=bool(fleet.candidates(route.small, now)),
                       busy=busy)
    observation = request[OBSERVATION]
    observation.small_model = selection.small
    observation.model_reason = selection.reason
    return selection
