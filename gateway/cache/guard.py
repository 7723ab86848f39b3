"""The near-miss guard: every semantic hit must pass it.

Two questions can be close in embedding space and still want different answers: they differ in
a number, a unit, a quoted string, a command, a "not", the order of two named things around
"to", a name, a language or the audience. `veto(new, cached)` compares what decides the answer
and names the first difference found; None lets the hit through. It only ever vetoes: a
question pair it cannot read (no words, another script) is judged on what it can read.

Pure: texts in, a value out. `Question` holds what the checks read from one text, so a caller
can compute the cached side once and keep it (`features(text)`, then `compare`).

What is compared, in order (each a `Veto.kind`):
- language: the script and the function words of the question, and the languages it names;
- code: backtick spans and identifier-like tokens (paths, flags, dotted or snake_case names,
  tokens with symbols or letters and digits mixed), verbatim, symbols included;
- quoted: the strings in double, single or typographic quotes, casefolded;
- audience: who the answer is for ("like I'm five", "for an expert", "in simple terms") and how
  long it is asked to be ("briefly", "in detail");
- number: every number, digits or words ("5" and "five" agree; "1,000" and "1000" too);
- date: months, weekdays, "today"/"tomorrow"/..., "this/next/last week";
- unit: units and currencies, each spelling to one name ("km" and "kilometres" agree), and
  their order ("Celsius in Fahrenheit" converts the other way from "Fahrenheit in Celsius");
- negation: how many negating words each has ("not", "never", "without", "avoid", ...), and
  antonyms: a word in one and its opposite in the other, by a polar prefix of one stem
  ("legal"/"illegal", "encrypt"/"decrypt") or a list of opposites ("best"/"worst");
- number, again: a noun counted as one in one question and as many in the other ("a file",
  "multiple files"; guard_roles.py);
- direction: the named things on either side of a directional word (to, into, from, vs, than,
  over, arrows) swapped between the two, unless the relation holds both ways ("how far");
  two of the same words exchanged ("my landlord owes me" vs "I owe my landlord"), or two
  named as alternatives in one and related in the other (guard_roles.py);
- entity: a capitalised or upper-case name in one that the other does not contain, or one or
  two content words put in others' place with everything else the same ("vegan"/"vegetarian").
The readers of each are in gateway/cache/guard_read.py, their word lists in guard_words.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.cache import guard_read as read
from gateway.cache import guard_roles as roles
from gateway.cache import guard_words as words

KINDS = ("code", "quoted", "number", "date", "unit", "negation", "direction", "entity",
         "language", "audience")

REPLACED_WORDS = 2  # the longest run of content words read as a replacement, and the
# fewest words around it (the same in both) for two
_WORD = re.compile(r"\w+")
ROOT = 5  # letters two words share at the start when they are of one root

# Each word stem of the list of opposites, to the stems of its opposites.
_OPPOSITE_STEMS: dict[str, set[str]] = {}
for _pair in words.ANTONYMS:
    _first, _second = sorted(read.word_stem(word) for word in _pair)
    _OPPOSITE_STEMS.setdefault(_first, set()).add(_second)
    _OPPOSITE_STEMS.setdefault(_second, set()).add(_first)


@dataclass(frozen=True, slots=True)
class Veto:
    kind: str  # one of KINDS
    detail: str  # what differs, for logs and `kvgate cache eval`


@dataclass(frozen=True, slots=True)
class Question:
    """What the guard reads from one question."""

    code: frozenset[str]
    quoted: frozenset[str]
    numbers: frozenset[str]
    dates: frozenset[str]
    units: frozenset[str]
    conversions: frozenset[tuple[str, str]]  # two units joined by "in", "to", "per", ...
    negations: int
    words: frozenset[str]  # every word, casefolded: what names are looked up in
    pairs: tuple[tuple[frozenset[str], frozenset[str]], ...]  # (from-side, to-side)
    entities: frozenset[str]
    script: str
    language: str  # "" when the function words do not tell
    languages: frozenset[str]  # the languages it names
    audience: frozenset[str]
    content: tuple[str, ...]  # the content words in order, stemmed
    counts: tuple[frozenset[str], frozenset[str]]  # nouns counted as one, and as many
    actors: tuple[str, ...]  # content words and persons in order (guard_roles.actors)


def veto(new: str, cached: str) -> Veto | None:
    """Why the answer to `cached` must not serve `new`; None when nothing decisive differs."""
    if new == cached:
        return None
    return compare(features(new), features(cached))


def allows(new: str, cached: str) -> bool:
    return veto(new, cached) is None


def features(text: str) -> Question:
    """What the checks read from `text`."""
    text, code, quoted = read.prepare(text)
    tokens = read.tokenize(text)
    lows = [token.low for token in tokens]
    code |= {token.low for token in tokens if read.is_identifier(token.raw)}
    units, conversions = read.units_of(tokens)
    return Question(
        code=frozenset(code), quoted=frozenset(quoted), numbers=read.numbers_of(text, lows),
        dates=read.dates_of(tokens), units=units, conversions=conversions, negations=sum(
            low in words.NEGATIONS for low in lows),
        words=frozenset(part for low in lows for part in _WORD.findall(low)) | set(lows),
        pairs=read.directional_pairs(lows), entities=read.entities_of(tokens),
        script=read.script_of(text),
        language=read.language_of(lows), languages=frozenset(
            words.LANGUAGE_NAMES[low] for low in lows if low in words.LANGUAGE_NAMES),
        audience=read.audience_of(lows), content=tuple(
            read.content_word(part) for token in tokens
            if token.kind in ("word", "sym") and token.low not in words.STOPWORDS
            for part in _parts(token.low)),
        counts=roles.counted(lows), actors=roles.actors(lows))


def _parts(low: str) -> list[str]:
    """A hyphenated word's parts ("cold-brew" as "cold brew"), any other word itself."""
    return [part for part in low.split("-") if part] if read.is_hyphenated(low) else [low]


def compare(new: Question, cached: Question) -> Veto | None:
    """The first decisive difference between two questions' features, or None."""
    if new.script != cached.script or (new.language and cached.language
                                       and new.language != cached.language):
        return Veto("language", f"{new.script}/{new.language or '?'} vs"
                                f" {cached.script}/{cached.language or '?'}")
    for kind, mine, theirs in (("code", new.code, cached.code),
                               ("quoted", new.quoted, cached.quoted),
                               ("language", new.languages, cached.languages),
                               ("audience", new.audience, cached.audience),
                               ("number", new.numbers, cached.numbers),
                               ("date", new.dates, cached.dates),
                               ("unit", new.units, cached.units)):
        if mine != theirs:
            return Veto(kind, _difference(mine, theirs))
    for first, second in new.conversions:  # "Celsius in Fahrenheit" vs "Fahrenheit in Celsius"
        if (second, first) in cached.conversions and (first, second) not in cached.conversions:
            return Veto("unit", f"{first} -> {second} vs {second} -> {first}")
    counts = roles.count_differs(new.counts, cached.counts)
    if counts:
        return Veto("number", counts)
    if new.negations != cached.negations:
        return Veto("negation", f"{new.negations} negations vs {cached.negations}")
    opposite = _antonyms(new.words - cached.words, cached.words - new.words)
    if opposite:
        return Veto("negation", f"{opposite[0]} vs {opposite[1]}")
    symmetric = roles.symmetric(new.actors) and roles.symmetric(cached.actors)
    swapped = None if symmetric else (_swapped(new.pairs, cached.pairs)
                                      or _swapped(cached.pairs, new.pairs))
    if swapped:
        return Veto("direction", swapped)
    exchanged = roles.exchanged(new.actors, cached.actors)
    if exchanged:
        return Veto("direction", f"{exchanged[0]} and {exchanged[1]} exchanged")
    choice = (roles.uncoordinated(new.actors, cached.actors)
              or roles.uncoordinated(cached.actors, new.actors))
    if choice:
        return Veto("direction", f"{choice[0]} or {choice[1]} vs one to the other")
    missing = sorted((new.entities - cached.words) | (cached.entities - new.words))
    if missing:
        return Veto("entity", ", ".join(missing))
    replaced = _replaced(new.content, cached.content)
    if replaced:
        return Veto("entity", f"{replaced[0]} in place of {replaced[1]}")
    return None


def _replaced(mine: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, str] | None:
    """The one or two content words put in the place of others, all else the same and in the
    same order ("a vegan recipe" vs "a vegetarian recipe", "an alligator and a crocodile" vs
    "a frog and a toad"): a question reworded keeps what it asks about and changes how it
    asks; one that swaps only what it asks about is another question. Not a replacement: an
    inflection or a one-letter spelling variant ("tyre", "tire"), words of one root
    ("summarize", "summary"), words moved (the two spans sharing a word), or two words
    opening the question (how it asks, not what)."""
    start = 0
    while start < min(len(mine), len(theirs)) and mine[start] == theirs[start]:
        start += 1
    end = 0
    while end < min(len(mine), len(theirs)) - start and mine[-1 - end] == theirs[-1 - end]:
        end += 1
    own, other = mine[start:len(mine) - end], theirs[start:len(theirs) - end]
    longest = max(len(own), len(other))
    if not (own and other) or longest > REPLACED_WORDS or start + end < longest \
            or set(own) & set(other):
        return None
    if start == 0 and longest > 1:  # the opening reworded: how it asks ("Summarize the ...")
        return None
    if len(own) == len(other) == 1 and _spelling_variants(own[0], other[0]):
        return None
    if any(_one_root(a, b) for a in own for b in other):
        return None
    return " ".join(own), " ".join(other)


def _one_root(first: str, second: str) -> bool:
    """Two stems of one root: they share their first ROOT letters or more, and the shorter
    all but its last letter at most ("summary", "summariz"; not "chicken", "chickpea")."""
    shared = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        shared += 1
    return shared >= ROOT and shared >= min(len(first), len(second)) - 1


def _spelling_variants(first: str, second: str) -> bool:
    """At most one letter apart (one changed, added or dropped)."""
    if len(first) == len(second):
        return sum(a != b for a, b in zip(first, second, strict=True)) <= 1
    if len(first) > len(second):
        first, second = second, first
    return len(second) == len(first) + 1 and any(
        second[:index] + second[index + 1:] == first for index in range(len(second)))


def _difference(mine: Iterable[str], theirs: Iterable[str]) -> str:
    return f"{sorted(mine)} vs {sorted(theirs)}"


def _antonyms(mine: frozenset[str], theirs: frozenset[str]) -> tuple[str, str] | None:
    """A word of `mine` and its opposite in `theirs`, by the list of opposites or by one stem
    under two polar prefixes; linear in the words (each word's forms are looked up)."""
    opposites: dict[str, str] = {}  # a stem that would oppose a word of mine -> that word
    forms: dict[str, list[tuple[str, str]]] = {}  # stem -> (prefix, word of mine)
    for word in sorted(mine, reverse=True):
        for partner in _OPPOSITE_STEMS.get(read.word_stem(word), ()):
            opposites[partner] = word
        for prefix, stem in _polar_forms(word):
            forms.setdefault(stem, []).append((prefix, word))
    for other in sorted(theirs):
        opposed = opposites.get(read.word_stem(other))
        if opposed is not None:
            return opposed, other
        for prefix, stem in _polar_forms(other):
            for own_prefix, own in forms.get(stem, ()):
                if own_prefix != prefix:
                    return own, other
    return None


def _polar_forms(word: str) -> list[tuple[str, str]]:
    """The (prefix, stem) readings of `word`: itself unprefixed, and each polar prefix it
    starts with, before a stem long enough for that prefix ("illegal": ("il", "legal"))."""
    forms = [("", word)]
    for prefix, shortest in words.POLAR_PREFIXES.items():
        stem = word[len(prefix):].lstrip("-")
        if word.startswith(prefix) and len(stem) >= shortest:
            forms.append((prefix, stem))
    for suffix, opposite in words.SUFFIX_OPPOSITES:  # "careful"/"careless": one stem, two ends
        for end in (suffix, opposite):
            if word.endswith(end) and len(word) > len(end) + 2:
                forms.append(("-" + end, word[:-len(end)] + "-"))  # meets only suffix forms
    return forms


def _swapped(mine: tuple[tuple[frozenset[str], frozenset[str]], ...],
             theirs: tuple[tuple[frozenset[str], frozenset[str]], ...]) -> str | None:
    for source, target in _distinct(mine):
        for other_source, other_target in _distinct(theirs):
            forward = source & other_target
            backward = target & other_source
            if forward and backward and forward != backward and not (
                    forward & other_source or backward & other_target):
                return f"{sorted(source)}->{sorted(target)} vs" \
                       f" {sorted(other_source)}->{sorted(other_target)}"
    return None


def _distinct(pairs: Iterable[tuple[frozenset[str], frozenset[str]]]
              ) -> list[tuple[frozenset[str], frozenset[str]]]:
    """Each pair without the words on both of its sides ("Windows 10 to Windows 11": 10, 11)."""
    return [(source - target, target - source) for source, target in pairs]

