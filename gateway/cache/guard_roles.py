"""Two readers of the near-miss guard (gateway/cache/guard.py): how many of a thing a question
asks about, and who does what to whom.

- Count: "rename a file" and "rename multiple files" want different answers (one `mv`, or a
  loop), as do "undo a commit" and "undo several commits". `counted(lows)` reads the nouns
  under a singular determiner ("a", "an", "one", "single") and those under a plural
  quantifier ("multiple", "several", "many", "all", "every", ...), each by its singular form;
  a noun counted as one in a question and as many in the other decides the answer. A plural
  alone is not read as a count: "what is a closure" and "what are closures" ask the same.
- Roles: "my landlord owes me money" and "I owe my landlord money" hold the same words, two
  of them exchanged. `actors(lows)` is the question's content words in order with the
  personal pronouns kept as who they name ("I" and "me" are one person); two questions whose
  actors are the same but for two that changed places ask about other roles, unless the two
  are coordinated ("rent or buy", "cats and dogs") or the relation is symmetric ("how far is
  X from Y"). And "should the tenant or the landlord pay" asks which of two, where "should the
  landlord pay the tenant" relates one to the other: two actors coordinated in one question
  and not in the other (`uncoordinated`), unless the question compares them ("the
  difference between X and Y", "how does X differ from Y").

Pure: word lists in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.cache import guard_read as read
from gateway.cache import guard_words as words

SINGULAR = frozenset({"a", "an", "one", "single"})
PLURAL = frozenset({"multiple", "several", "many", "all", "every", "various", "numerous",
                    "both", "few", "couple", "bunch", "lots", "dozens", "hundreds"})
NOUN_RUN = 3  # content words read after a determiner; the last of them is its noun
PERSONS = {"i": "@me", "me": "@me", "myself": "@me", "we": "@us", "us": "@us",
           "you": "@you", "he": "@him", "him": "@him", "she": "@her", "they": "@them",
           "them": "@them"}
COORDINATORS = frozenset({"and", "or", "nor", "&", "vs", "versus", "/"})
SYMMETRIC = frozenset({"far", "distance", "apart"})  # "how far is X from Y" holds both ways
# Words under which "X and Y" compares the two rather than asks which of them.
COMPARING = frozenset({"difference", "differences", "differ", "differs", "between", "compare",
                       "comparison", "versus", "vs", "similar", "same", "like", "unlike"})
_PLURAL_ENDS = ("sses", "shes", "ches", "xes", "zes")
_WORDLIKE = re.compile(r"\w")
_SYMMETRIC = frozenset(read.content_word(word) for word in SYMMETRIC)
_COMPARING = frozenset(read.content_word(word) for word in COMPARING) | {"&"}


def singular(word: str) -> str:
    """The singular form of an English plural noun ("processes": "process", "files": "file",
    "queries": "query"); a word that is no plural stays itself."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(_PLURAL_ENDS):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def counted(lows: Sequence[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The nouns counted as one and those counted as many, by their singular forms."""
    one: set[str] = set()
    many: set[str] = set()
    for index, low in enumerate(lows):
        if low not in SINGULAR and low not in PLURAL:
            continue
        run: list[str] = []
        for later in lows[index + 1:index + 1 + NOUN_RUN]:
            if later in words.STOPWORDS or later in read.SENTENCE_END or not later[:1].isalpha():
                break
            run.append(later)
        if not run:
            continue
        noun = run[-1]
        if low in PLURAL:
            many.add(singular(noun))
        elif singular(noun) == noun:  # "a users guide" counts no users
            one.add(noun)
    return frozenset(one), frozenset(many)


def count_differs(mine: tuple[frozenset[str], frozenset[str]],
                  theirs: tuple[frozenset[str], frozenset[str]]) -> str | None:
    """A noun counted as one in a question and as many in the other, or None."""
    for (one, _), (_, many) in ((mine, theirs), (theirs, mine)):
        both = sorted(one & many)
        if both:
            return f"one {both[0]} vs many"
    return None


def actors(lows: Sequence[str]) -> tuple[str, ...]:
    """The content words in order (stemmed, hyphenated words by their parts), personal pronouns
    as who they name, coordinators kept to tell "X or Y" from "X does Y"."""
    found: list[str] = []
    for low in lows:
        if low in PERSONS:
            found.append(PERSONS[low])
        elif low in COORDINATORS:
            found.append("&")
        elif low in words.STOPWORDS or not _WORDLIKE.match(low):
            continue
        else:
            found.extend(read.content_word(part) for part in low.split("-") if part)
    return tuple(found)


def exchanged(mine: Sequence[str], theirs: Sequence[str]) -> tuple[str, str] | None:
    """The two actors that changed places between two questions otherwise the same, or None
    (another difference, a coordination, a symmetric relation)."""
    if len(mine) != len(theirs) or sorted(mine) != sorted(theirs):
        return None
    differing = [index for index, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
    if len(differing) != 2:
        return None
    first, second = differing
    if mine[first] != theirs[second] or mine[second] != theirs[first]:
        return None
    if "&" in mine[first:second] or symmetric(mine) or symmetric(theirs):
        return None
    return mine[first], mine[second]


def symmetric(actors_of: Sequence[str]) -> bool:
    """Whether a question asks about a relation that holds both ways ("how far", "between")."""
    return not _SYMMETRIC.isdisjoint(actors_of)


def uncoordinated(mine: Sequence[str], theirs: Sequence[str]) -> tuple[str, str] | None:
    """Two actors joined by "or"/"and" in `mine`, both in `theirs` and not joined there, or
    None; never when either question compares them."""
    if not (_COMPARING - {"&"}).isdisjoint({*mine, *theirs}) or symmetric(mine) \
            or symmetric(theirs):
        return None
    joined = _coordinated(theirs)
    for pair in _coordinated(mine):
        first, second = pair
        if first in theirs and second in theirs and pair not in joined:
            return first, second
    return None


def _coordinated(sequence: Sequence[str]) -> set[tuple[str, str]]:
    return {tuple(sorted((sequence[index - 1], sequence[index + 1])))  # type: ignore[misc]
            for index in range(1, len(sequence) - 1)
            if sequence[index] == "&" and "&" not in (sequence[index - 1], sequence[index + 1])}
