"""A prompt's features, from its text alone: pure, deterministic across processes.

The cheap features (`CHEAP_NAMES`, in that order) are what a length limit or a keyword list
sees, made numeric: the prompt's length, how much of it is digits and operators, how long its
longest number is, how code-like it is, and what kind of question it is. The hashed features
are its lower-cased words and word pairs, each hashed (crc32, stable across runs, unlike
`hash`) into one of `HASHED_DIMENSIONS` buckets, the vector scaled to unit length: the
classifier's vocabulary when no sentence embedding is available.
"""

from __future__ import annotations

import math
import re
import zlib

from routing.difficulty.cues import CUE_NAMES, FIRST_PERSON, counts

HASHED_DIMENSIONS = 2048
CHEAP_NAMES = (
    "log_chars", "log_words", "digit_share", "log_operators", "log_longest_number",
    "log_code_marks", "question_mark", "wh_question", "imperative", "non_ascii_share",
    "log_lines", *CUE_NAMES, "first_person",
)  # fmt: skip

_WORD = re.compile(r"\w+", re.UNICODE)
_NUMBER = re.compile(r"\d[\d,._]*\d|\d")
_OPERATOR = re.compile(r"[\^*/%=<>+]|(?<!\w)(?:mod|sqrt|log|sin|cos|lim|sum|det)(?!\w)")
_CODE_MARK = re.compile(
    r"[{};]|=>|->|::|\(\)|(?<!\w)(?:def|class|return|func|fn|import|const|let|var|struct|"
    r"select|where|join|async|await|lambda)(?!\w)")
_WH = frozenset(("what", "what's", "whats", "who", "when", "where", "which", "whose", "how",
                 "is", "are", "does", "do", "can", "quel", "quelle", "qué", "que", "was",
                 "wie", "qual", "come"))
_IMPERATIVE = frozenset((
    "write", "build", "implement", "design", "prove", "show", "derive", "explain", "compute",
    "find", "solve", "calculate", "integrate", "estimate", "compare", "model", "draft", "port",
    "make", "create", "fix", "price", "plan", "argue", "evaluate", "determine", "minimise",
    "minimize", "maximise", "maximize", "factor", "parse", "map", "extract", "cluster",
    "translate", "rewrite", "diff", "align", "normalise", "normalize", "read", "turn",
))  # fmt: skip


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def cheap(text: str) -> tuple[float, ...]:
    """The cheap features of `text`, in `CHEAP_NAMES` order."""
    chars = len(text)
    tokens = words(text)
    digits = sum(ch.isdigit() for ch in text)
    numbers = _NUMBER.findall(text)
    longest = max((sum(ch.isdigit() for ch in number) for number in numbers), default=0)
    first = tokens[0] if tokens else ""
    non_ascii = sum(not ch.isascii() for ch in text)
    stripped = text.rstrip()
    lowered = text.lower()
    return (
        math.log1p(chars),
        math.log1p(len(tokens)),
        digits / chars if chars else 0.0,
        math.log1p(len(_OPERATOR.findall(lowered))),
        math.log1p(longest),
        math.log1p(len(_CODE_MARK.findall(lowered))),
        1.0 if stripped.endswith(("?", "？")) else 0.0,
        1.0 if first in _WH else 0.0,
        1.0 if first in _IMPERATIVE else 0.0,
        non_ascii / chars if chars else 0.0,
        math.log1p(text.count("\n")),
        *(math.log1p(count) for count in counts(lowered)),
        math.log1p(len(FIRST_PERSON.findall(lowered))),
    )


def hashed(text: str) -> dict[int, float]:
    """The unit-length hashed word and word-pair vector of `text`, as {bucket: value}."""
    tokens = words(text)
    counts: dict[int, float] = {}
    grams = tokens + [f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)]
    for gram in grams:
        bucket = zlib.crc32(gram.encode()) % HASHED_DIMENSIONS
        counts[bucket] = counts.get(bucket, 0.0) + 1.0
    norm = math.sqrt(sum(value * value for value in counts.values()))
    return {bucket: value / norm for bucket, value in counts.items()} if norm else {}
