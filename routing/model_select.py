"""Small-model routing: which model serves a request sent to a routing alias.

A client that asks for a route's alias (say `auto`) lets the gateway choose between the route's
large model and its small one. A request is *easy* when nothing in it needs the large model: its
prompt is short, it asks for a short answer, its conversation is short and its text has none of
the route's hard markers (code fences, "step by step", "prove", ...). Then:

- mode `easy`: every easy request goes to the small model;
- mode `overflow`: an easy request goes to the small model only while the large model is busy
  (requests wait for it in the gateway queue, or every backend serving it reports waiting
  sequences or KV usage at its high-water mark), so the large model serves everything it can;
  and when the large model's admission refuses one (429: its queue is full, or it is past its
  TPOT SLO), the small model takes it instead (gateway/handlers.py).

A hard request always goes to the large model, and so does an easy one when no healthy backend
serves the small model. A client that names a model gets that model: only the alias chooses.

Everything here is pure: the caller passes the request's text and the large model's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from routing.state import Candidate

Mode = Literal["easy", "overflow"]
OVERFLOW = "overflow"  # a Selection's reason: an easy request the busy large model passes on
LARGE_FREE = "large_free"  # and one the large model has room for (mode overflow)
CHARS_PER_TOKEN = 4  # the prompt-length estimate: English text runs ~4 characters a token
DEFAULT_HARD_MARKERS = (
    "```", "step by step", "step-by-step", "prove", "proof", "derive", "theorem", "algorithm",
    "debug", "stack trace", "traceback", "refactor", "implement", "optimi", "analyze", "analyse",
    "in detail", "essay", "legal", "diagnos",
)


@dataclass(frozen=True, slots=True)
class SmallModelRoute:
    alias: str  # the model name clients ask for
    large: str
    small: str
    mode: Mode = "easy"
    max_prompt_tokens: int = 1024  # an easy prompt is at most this long (estimated)
    max_output_tokens: int = 512  # and asks for at most this many tokens (unset: not easy)
    max_turns: int = 6  # and a chat has at most this many user turns
    hard_markers: tuple[str, ...] = DEFAULT_HARD_MARKERS  # case-insensitive substrings


@dataclass(frozen=True, slots=True)
class Selection:
    model: str
    small: bool
    reason: str  # why: "easy", "overflow", or what made it large ("long_prompt", ...)


@dataclass(frozen=True, slots=True)
class Ask:
    """What the choice reads of a request."""

    text: str  # the prompt's text (every message's, or the completion prompt)
    max_tokens: int | None  # the answer's cap the client set; None: the server's default
    turns: int  # user messages (1 for a completion)


def hardness(route: SmallModelRoute, ask: Ask) -> str | None:
    """Why the request needs the large model, or None when it is easy."""
    if len(ask.text) > route.max_prompt_tokens * CHARS_PER_TOKEN:
        return "long_prompt"
    if ask.max_tokens is None or ask.max_tokens > route.max_output_tokens:
        return "long_output"
    if ask.turns > route.max_turns:
        return "many_turns"
    lowered = ask.text.lower()
    if any(marker in lowered for marker in route.hard_markers):
        return "hard_marker"
    return None


def large_busy(candidates: Sequence[Candidate], queued: int, high_water: float) -> bool:
    """True while requests wait for the large model in the gateway queue, or while every healthy
    backend serving it is full: waiting sequences, or KV usage at `high_water` or above. A
    backend whose state is unknown (no fresh scrape) counts as having room."""
    if queued > 0:
        return True
    if not candidates:
        return True
    for candidate in candidates:
        snapshot = candidate.snapshot
        if snapshot is None or candidate.stale:
            return False
        if not snapshot.waiting and (snapshot.kv_usage or 0.0) < high_water:
            return False
    return True


def select(route: SmallModelRoute, ask: Ask, *, small_available: bool,
           busy: bool = False) -> Selection:
    """The model for `ask`. `busy` (mode overflow) is `large_busy` of the large model."""
    hard = hardness(route, ask)
    if hard is not None:
        return Selection(route.large, False, hard)
    if not small_available:
        return Selection(route.large, False, "small_unavailable")
    if route.mode == "overflow":
        if not busy:
            return Selection(route.large, False, LARGE_FREE)
        return Selection(route.small, True, OVERFLOW)
    return Selection(route.small, True, "easy")
