"""Small-model routing: which model serves a request sent to a routing alias.

A client that asks for a route's alias (say `auto`) lets the gateway choose between the route's
large model and its small one, in two stages.

Rules first, for what is certain (`certain`): the client pinned the large model
(`x-kvgate-model-route: large`), the request carries tools or a `response_format`, its prompt is
longer than the small model's window (`max_prompt_tokens`, estimated), it asks for more output
than the alias allows (`max_output_tokens`; a request without `max_tokens` asks for nothing in
particular and is left to the classifier), its conversation has more user turns than
`max_turns`, or its text has one of the route's hard markers. A marker matches whole words (or is
a regular expression after `re:`), never inside a word: `prove` does not match "improve".

Then the classifier's score (routing/difficulty: the probability that the prompt is hard) decides
the rest: below the threshold in force the prompt is easy. Under pressure on the large pool the
threshold rises by the alias's step, never past its ceiling (routing/difficulty/calibrate.py).

- mode `easy`: every easy request goes to the small model;
- mode `overflow`: an easy request goes to the small model only while the large model is busy
  (requests wait for it in the gateway queue, or every backend serving it reports waiting
  sequences or KV usage at its high-water mark), so the large model serves everything it can;
  and when the large model's admission refuses one (reason `large_free`), the small model takes
  it instead (gateway/complete.py). A hard request is never sent small, busy or not;
- mode `shadow`: the decision is made and reported (`shadow:easy`, `shadow:hard`), every request
  goes to the large model.

A hard request always goes to the large model, and so does an easy one when no healthy backend
serves the small model. A client that names a model gets that model: only the alias chooses.

Everything here is pure: the caller passes the request's facts, its score and the pressure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from routing.difficulty.calibrate import Thresholds
from routing.state import Candidate

Mode = Literal["easy", "overflow", "shadow"]
OVERFLOW = "overflow"  # a Selection's reason: an easy request the busy large model passes on
LARGE_FREE = "large_free"  # and one the large model has room for (mode overflow)
EASY, HARD = "easy", "hard"  # the classifier's verdicts
SHADOW = "shadow:"  # prefix of a verdict mode shadow reports without acting on it
CHARS_PER_TOKEN = 4  # the prompt-length estimate: English text runs ~4 characters a token
REGEX_PREFIX = "re:"
DEFAULT_HARD_MARKERS = (
    "```", "step by step", "step-by-step", "prove", "proof", "derive", "theorem", "traceback",
    "stack trace",
)


@dataclass(frozen=True, slots=True)
class SmallModelRoute:
    alias: str  # the model name clients ask for
    large: str
    small: str
    mode: Mode = "easy"
    max_prompt_tokens: int = 1024  # the small model's window: a longer prompt goes large
    max_output_tokens: int = 512  # a request asking for more goes large
    max_turns: int = 6  # and a chat with more user turns
    hard_markers: tuple[str, ...] = DEFAULT_HARD_MARKERS  # whole words, any case; or `re:...`


@dataclass(frozen=True, slots=True)
class Selection:
    model: str
    small: bool
    reason: str  # the rule that decided, or the verdict ("easy", "overflow", "hard", ...)
    score: float | None = None  # the classifier's score, when it decided
    threshold: float | None = None  # and the threshold in force

    @property
    def header(self) -> str:
        """The `x-kvgate-model-reason` value: the rule, or the verdict with its score and the
        threshold in force."""
        if self.score is None or self.threshold is None:
            return self.reason
        return f"{self.reason}; score={self.score:.3f}; threshold={self.threshold:.3f}"


@dataclass(frozen=True, slots=True)
class Ask:
    """What the choice reads of a request."""

    text: str  # the prompt's text (every message's, or the completion prompt)
    max_tokens: int | None  # the answer's cap the client set; None: the server's default
    turns: int  # user messages (1 for a completion)
    tools: bool = False  # the body carries tools (or functions)
    response_format: bool = False  # the body asks for a response format (JSON, a schema)
    pinned_large: bool = False  # the client sent `x-kvgate-model-route: large`


@lru_cache(maxsize=64)
def marker_pattern(markers: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive pattern matching any of `markers` as whole words (a marker starting
    `re:` is a regular expression as it stands). None when there are none."""
    parts = [marker[len(REGEX_PREFIX):] if marker.startswith(REGEX_PREFIX)
             else rf"(?<!\w){re.escape(marker)}(?!\w)" for marker in markers if marker]
    return re.compile("|".join(f"(?:{part})" for part in parts), re.IGNORECASE) if parts else None


def certain(route: SmallModelRoute, ask: Ask) -> str | None:
    """The rule that sends the request large for certain, or None: the classifier decides."""
    if ask.pinned_large:
        return "pinned"
    if ask.tools:
        return "tools"
    if ask.response_format:
        return "response_format"
    if len(ask.text) > route.max_prompt_tokens * CHARS_PER_TOKEN:
        return "long_prompt"
    if ask.max_tokens is not None and ask.max_tokens > route.max_output_tokens:
        return "long_output"
    if ask.turns > route.max_turns:
        return "many_turns"
    pattern = marker_pattern(route.hard_markers)
    if pattern is not None and pattern.search(ask.text):
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


def select(route: SmallModelRoute, ask: Ask, score: float | None, thresholds: Thresholds, *,
           small_available: bool, busy: bool = False) -> Selection:
    """The model for `ask`, whose classifier score is `score`: None only when a rule is
    `certain` (the caller need not score it then; ValueError otherwise). `busy` is `large_busy`
    of the large model: the pressure that loosens the threshold, and what sends easy requests
    small in mode overflow."""
    rule = certain(route, ask)
    if rule is not None:
        return Selection(route.large, False, rule)
    if score is None:
        raise ValueError("no rule decides this request: it needs the classifier's score")
    threshold = thresholds.in_force(busy)
    verdict = EASY if score < threshold else HARD
    if route.mode == "shadow":
        return Selection(route.large, False, SHADOW + verdict, score, threshold)
    if verdict == HARD:
        return Selection(route.large, False, HARD, score, threshold)
    if not small_available:
        return Selection(route.large, False, "small_unavailable", score, threshold)
    if route.mode == "overflow":
        if not busy:
            return Selection(route.large, False, LARGE_FREE, score, threshold)
        return Selection(route.small, True, OVERFLOW, score, threshold)
    return Selection(route.small, True, EASY, score, threshold)
