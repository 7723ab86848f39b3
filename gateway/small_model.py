"""The completion path's side of small-model routing: read the request and the large model's
state, let `routing.model_select.select` choose.

The choice is stamped on the response as `x-kvgate-model-reason` (`easy`, `overflow`, or what
kept it on the large model: `long_prompt`, `long_output`, `many_turns`, `hard_marker`,
`small_unavailable`, `large_free`); `x-kvgate-model` names the model that served it.
"""

from __future__ import annotations

from aiohttp import web

from gateway.admission import GATE
from gateway.exchange import Asked
from gateway.keys import CLOCK, FLEET, SETTINGS
from routing.model_select import Ask, Selection, SmallModelRoute, large_busy, select


def choose(app: web.Application, route: SmallModelRoute, asked: Asked) -> Selection:
    fleet, now = app[FLEET], app[CLOCK]()
    ask = Ask(text=asked.prompt_text or "", max_tokens=asked.output_cap, turns=asked.user_turns)
    busy = False
    if route.mode == "overflow":
        queued = app[GATE].dispatcher.queue_depths().get(route.large, 0)
        busy = large_busy(fleet.candidates(route.large, now), queued,
                          app[SETTINGS].routing.high_water)
    return select(route, ask, small_available=bool(fleet.candidates(route.small, now)),
                  busy=busy)
