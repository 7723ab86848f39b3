"""Metric label keys and the bound on their values.

Every label value that comes from a request (models, backends, policies, reasons) passes through
`LabelGuard`, so a client sending ten thousand model names cannot grow ten thousand series.
"""

from __future__ import annotations

# GenAI semantic-convention keys.
OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"
# kvgate's own.
BACKEND = "kvgate.backend"
POLICY = "kvgate.routing.policy"
CACHE_RESULT = "kvgate.cache.result"
CACHE_TIER = "kvgate.cache.tier"
LOOKUP_RESULT = "kvgate.cache.lookup"  # "hit" or "miss" of one tier's lookup
ADMISSION_RESULT = "kvgate.admission.result"
ADMISSION_REASON = "kvgate.admission.reason"
SMALL_MODEL = "kvgate.small_model.chosen"
SMALL_MODEL_VERDICT = "kvgate.small_model.verdict"  # the classifier's: "easy" or "hard"
POLL_ERROR = "kvgate.poll.error"
RETRY_REASON = "reason"  # why an attempt was tried again (gateway/attempt.py's RETRY_*)

OTHER = "_OTHER"  # the value that stands for every value past the bound
MAX_VALUE_LENGTH = 128


class LabelGuard:
    """Admits the first `max_values` distinct values of each key; the rest read as `OTHER`.

    Values longer than MAX_VALUE_LENGTH also read as `OTHER`. The first values seen win, which is
    what an operator wants: the models and backends that were there from the start keep their
    names. Single-threaded, like the event loop that calls it.
    """

    __slots__ = ("_max", "_seen")

    def __init__(self, max_values: int) -> None:
        self._max = max_values
        self._seen: dict[str, set[str]] = {}

    def __call__(self, key: str, value: str) -> str:
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = set()
        if value in seen:
            return value
        if len(seen) >= self._max or len(value) > MAX_VALUE_LENGTH:
            return OTHER
        seen.add(value)
        return value
