"""The near-miss guard: every semantic hit must pass it.

Two questions can be close in embedding space and still want different answers: they differ in
a number, a unit, a quoted string, a command, a "not", the order of two named things around
"to", a name, a language or the audience. `veto(new, cached)` compares what decides the answer
and names the first difference found; None lets the hit through. It only ever vetoes: a
question pair it cannot read (no words, another script) is judged on what it can read.

Pure: texts in, a value out. `Question` holds what the checks read from one text, so a caller
can compute the cached side once and keep it (`features(text)`, then `compare`).

What is compared, in order (each a `Veto.kind`):
- code: backtick spans and identifier-like tokens (paths, flags, dotted or snake_case names,
  tokens with symbols or letters and digits mixed), verbatim, symbols included;
- quoted: the strings in double, single or typographic quotes, casefolded;
- number: every number, digits or words ("5" and "five" agree; "1,000" and "1000" too);
- date: months, weekdays, "today"/"tomorrow"/..., "this/next/last week";
- unit: units and currencies, each spelling to one name ("km" and "kilometres" agree), and
  their order ("Celsius in Fahrenheit" converts the other way from "Fahrenheit in Celsius");
- negation: how many negating words each has ("not", "never", "without", "avoid", ...), and
  antonyms: a word in one and its opposite in the other, by a polar prefix of one stem
  ("legal"/"illegal", "encrypt"/"decrypt") or a list of opposites ("best"/"worst");
- direction: the named things on either side of a directional word (to, into, from, vs, than,
  over, arrows) swapped between the two;
- entity: a capitalised or upper-case name in one that the other does not contain, or one
  content word put in another's place with everything else the same ("vegan"/"vegetarian");
- language: the script and the function words of the question, and the languages it names;
- audience: who the answer is for ("like I'm five", "for an expert", "in simple terms") and how
  long it is asked to be ("briefly", "in detail").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from gateway.cache import guard_words as words

KINDS = ("code", "quoted", "number", "date", "unit", "negation", "direction", "entity",
         "language", "audience")


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


def veto(new: str, cached: str) -> Veto | None:
    """Why the answer to `cached` must not serve `new`; None when nothing decisive differs."""
    if new == cached:
        return None
    return compare(features(new), features(cached))


def allows(new: str, cached: str) -> bool:
    return veto(new, cached) is None


_CODE_SPAN = re.compile(r"```(.+?)```|`([^`]+)`", re.S)
_QUOTED = re.compile(r"\"([^\"]{1,300})\"|“([^”]{1,300})”|„([^“”]{1,300})[“”]|«([^»]{1,300})»"
                     r"|(?<![\w'])'([^'\n]{1,300}?)'(?![\w])|‘([^’\n]{1,300}?)’(?!\w)")
_ARROW = r"-->|->|→|=>|⇒|⟶|↦|<-|←"
_TOKEN = re.compile(rf"(?P<arrow>{_ARROW})"
                    r"|(?P<word>(?<![\w\-])--?[^\W\d_][\w\-]*"  # a flag: -x, --force
                    r"|(?<![\w.~/])(?:\.{1,2}/|~/|/)[\w.\-/~]*\w"  # a path: ./build, /etc
                    r"|[\w][\w'’\-./#+:@~]*[\w#+]|\w)"
                    r"|(?P<sym>[$€£¥₹₩₽%°])|(?P<punct>[.?!,;:()¿¡])")
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)")
_IDENTIFIER = re.compile(r"[/\\_=<>{}\[\]()$#@*~|&^+]|::|\w\.\w|^--?\w")
_HYPHENATED = re.compile(r"^[^\W\d_]+(?:-[^\W_]+)+$|^\d+(?:-[^\W\d_]+)+$")
_DEGREES = re.compile(r"°\s*([CF])\b")
_DATA_UNIT = re.compile(r"([kmgtpKMGTP]i?)([bB])(its?|ytes?|ps|/s)?")
_ABBREVIATION = re.compile(r"^(?:[^\W\d_]\.){2,}$|^(?:[^\W\d_]\.)+[^\W\d_]$")
_ORDINAL = re.compile(r"^\d+(?:st|nd|rd|th|s)$")
_SCRIPTS = (("CYRILLIC", "cyrillic"), ("GREEK", "greek"),
            ("ARABIC", "arabic"), ("HEBREW", "hebrew"), ("HIRAGANA", "japanese"),
            ("KATAKANA", "japanese"), ("CJK", "han"), ("HANGUL", "hangul"),
            ("DEVANAGARI", "devanagari"), ("THAI", "thai"), ("LATIN", "latin"))
_SENTENCE_END = frozenset(".?!:;¿¡(")
CONTEXT_WORDS = 3  # content words read on each side of a directional word


@dataclass(frozen=True, slots=True)
class _Token:
    raw: str  # as written
    low: str  # casefolded, possessive and apostrophes handled
    kind: str  # arrow, word, sym, punct


def features(text: str) -> Question:
    """What the checks read from `text`."""
    text = unicodedata.normalize("NFKC", text)
    code = {next(g for g in match.groups() if g is not None).strip()
            for match in _CODE_SPAN.finditer(text)}
    text = _CODE_SPAN.sub(" , ", text)
    quoted = {" ".join(next(g for g in match.groups() if g is not None).casefold().split())
              for match in _QUOTED.finditer(text)}
    text = _QUOTED.sub(" , ", text)
    text = _DEGREES.sub(lambda match: " celsius" if match.group(1) == "C" else " fahrenheit",
                        text)
    text = _PHRASES.sub(lambda match: words.PHRASES[match.group().casefold()], text)
    tokens = _tokens(text)
    lows = [token.low for token in tokens]
    code |= {token.low for token in tokens if _is_identifier(token.raw)}
    units = _units(tokens)
    return Question(
        code=frozenset(code), quoted=frozenset(quoted), numbers=_numbers(text, lows),
        dates=_dates(tokens), units=frozenset(name for name, _ in units),
        conversions=_conversions(units, lows), negations=sum(
            low in words.NEGATIONS for low in lows),
        words=frozenset(part for low in lows for part in re.findall(r"\w+", low)) | set(lows),
        pairs=_pairs(lows), entities=_entities(tokens), script=_script(text),
        language=_language(lows), languages=frozenset(
            words.LANGUAGE_NAMES[low] for low in lows if low in words.LANGUAGE_NAMES),
        audience=_audience(lows), content=tuple(
            _content_word(token.low) for token in tokens
            if token.kind in ("word", "sym") and token.low not in words.STOPWORDS))


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
    if new.negations != cached.negations:
        return Veto("negation", f"{new.negations} negations vs {cached.negations}")
    opposite = _antonyms(new.words - cached.words, cached.words - new.words)
    if opposite:
        return Veto("negation", f"{opposite[0]} vs {opposite[1]}")
    swapped = _swapped(new.pairs, cached.pairs) or _swapped(cached.pairs, new.pairs)
    if swapped:
        return Veto("direction", swapped)
    missing = sorted((new.entities - cached.words) | (cached.entities - new.words))
    if missing:
        return Veto("entity", ", ".join(missing))
    replaced = _replaced(new.content, cached.content)
    if replaced:
        return Veto("entity", f"{replaced[0]} in place of {replaced[1]}")
    return None


def _replaced(mine: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, str] | None:
    """The one content word put in the place of another, all else the same ("a vegan recipe"
    vs "a vegetarian recipe"): a question reworded keeps its thing and changes its phrasing;
    one that swaps the thing it asks about alone is another question. Inflections and
    one-letter spelling variants ("tyre", "tire") are the same word."""
    if len(mine) != len(theirs) or len(mine) < 2:
        return None
    differing = [(own, other) for own, other in zip(mine, theirs, strict=True) if own != other]
    if len(differing) != 1 or _spelling_variants(*differing[0]):
        return None
    return differing[0]


def _content_word(low: str) -> str:
    """A word as the other checks read it: a number its value, a unit its name, a negation
    "not", else its stem; so "tenth" is "10th" and "km" is "kilometres" here too."""
    if low in words.NUMBER_WORDS:
        return str(words.NUMBER_WORDS[low])
    number = re.fullmatch(r"(\d+(?:[.,]\d+)*)(?:st|nd|rd|th|s)?", low)
    if number:
        return _canonical_number(number.group(1))
    if low in words.NEGATIONS:
        return "not"
    unit = _unit(low, low)
    return unit[1] if unit is not None else _stem(low)


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


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "punct"
        raw = match.group()
        low = raw.casefold().replace("’", "'")
        if kind == "word":
            low = low.rstrip(".:")  # a sentence's full stop, not part of the word
            if _ABBREVIATION.match(raw):
                low = low.replace(".", "")
            if low in words.CONTRACTIONS:
                tokens.extend(_Token(raw, part, kind) for part in words.CONTRACTIONS[low])
                continue
            if low.endswith("n't"):
                tokens.extend((_Token(raw, low[:-3], kind), _Token(raw, "not", kind)))
                continue
            low = re.sub(r"'(?:s|re|ve|ll|m|d)$|'$", "", low)
        tokens.append(_Token(raw, low, kind))
    return tokens


def _is_identifier(raw: str) -> bool:
    word = re.sub(r"['’]s$", "", raw.rstrip(".:"))
    if not word or _HYPHENATED.match(word) or _ABBREVIATION.match(word) or _ORDINAL.match(word):
        return False
    if word.replace(".", "").replace(",", "").isdigit():
        return False  # a number: compared as one
    if word.casefold() in words.UNITS or word.casefold() in _AUDIENCE_WORDS:
        return False
    has_digit = any(char.isdigit() for char in word)
    has_alpha = any(char.isalpha() for char in word)
    return bool(_IDENTIFIER.search(word)) or (has_digit and has_alpha)


def _numbers(text: str, lows: list[str]) -> frozenset[str]:
    found: set[str] = set()
    for match in _NUMBER.finditer(text):
        found.add(_canonical_number(match.group(1)))
    previous = ""
    for low in lows:
        value = words.NUMBER_WORDS.get(low)
        if value is not None:
            if previous in words.TENS and value < 10:
                found.discard(str(words.NUMBER_WORDS[previous]))
                value += words.NUMBER_WORDS[previous]
            found.add(str(value))
        for part in low.split("-") if "-" in low else ():
            if part in words.NUMBER_WORDS:
                found.add(str(words.NUMBER_WORDS[part]))
        previous = low
    return frozenset(found)


def _canonical_number(number: str) -> str:
    """Thousands separators dropped ("1,000"), a decimal comma read as a point ("1,5")."""
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", number):
        number = number.replace(",", "")
    number = number.replace(",", ".")
    whole, _, fraction = number.partition(".")
    whole = whole.lstrip("0") or "0"
    return f"{whole}.{fraction}" if fraction else whole


def _dates(tokens: list[_Token]) -> frozenset[str]:
    found: set[str] = set()
    lows = [token.low for token in tokens]
    for index, token in enumerate(tokens):
        low = token.low
        near_number = any(0 <= other < len(lows) and lows[other][:1].isdigit()
                          for other in (index - 1, index + 1))
        if low in words.MONTHS and (low not in words.AMBIGUOUS_MONTHS or near_number
                                    or (token.raw[:1].isupper() and index > 0)):
            found.add(words.MONTHS[low])
        elif low in words.WEEKDAYS:
            found.add(words.WEEKDAYS[low])
        elif low in words.TIME_WORDS:
            found.add(low)
        elif low in words.SEASON_ALIASES and index and lows[index - 1] in (
                words.RELATIVE | {"the", "in"}):
            found.add(words.SEASON_ALIASES[low])
        if low in words.RELATIVE and index + 1 < len(lows):
            following = lows[index + 1]
            if following in words.PERIODS or following in words.WEEKDAYS:
                found.add(f"{low} {following}")
    return frozenset(found)


def _units(tokens: list[_Token]) -> list[tuple[str, int]]:
    """Each unit named, with the index of its token."""
    found: list[tuple[str, int]] = []
    lows = [token.low for token in tokens]
    for index, low in enumerate(lows):
        unit = _unit(tokens[index].raw, low)
        if unit is None:
            continue
        form, name = unit
        if form in words.NEEDS_NUMBER:
            previous = lows[index - 1] if index else ""
            if not (previous[:1].isdigit() or previous in words.NUMBER_WORDS
                    or previous in words.COUNT_WORDS):
                continue
        found.append((name, index))
    return found


def _conversions(units: list[tuple[str, int]], lows: list[str]) -> frozenset[tuple[str, str]]:
    """Consecutive units with a linking word between them, a few words apart, in their order."""
    found = set()
    for (first, start), (second, end) in zip(units, units[1:], strict=False):
        if first != second and end - start <= 6 and words.LINKS & set(lows[start + 1:end]):
            found.add((first, second))
    return frozenset(found)


def _unit(raw: str, low: str) -> tuple[str, str] | None:
    """The unit `low` spells (its singular form and canonical name), or None. A data unit is
    bytes with a capital B ("MB", "MBps"), bits with a small b after a capital ("Mb", "Mbps"),
    and as spelt out ("mbit", "mbyte"); all in small letters, "mb" is read as bytes and "mbps"
    as bits, as they are mostly meant."""
    for form in (low, low[:-1] if low.endswith("s") else "", low[:-2] if low.endswith("es")
                 else ""):
        if form and form in words.UNITS:
            return form, words.UNITS[form]
    match = _DATA_UNIT.fullmatch(raw)
    if match is None:
        return None
    prefix, letter, rest = match.group(1).casefold(), match.group(2), (match.group(3) or "")
    rest = rest.casefold()
    if rest.startswith("it") or (letter == "b" and match.group(1)[0].isupper()):
        size = "bit"
    elif rest.startswith("yte") or letter == "B":
        size = "byte"
    else:
        size = "bit" if rest in ("ps", "/s") else "byte"
    return low, prefix + size + ("/s" if rest in ("ps", "/s") else "")


def _antonyms(mine: frozenset[str], theirs: frozenset[str]) -> tuple[str, str] | None:
    """A word of `mine` and its opposite in `theirs`, by the list of opposites or by one stem
    under two polar prefixes; linear in the words (each word's forms are looked up)."""
    opposites: dict[str, str] = {}  # a stem that would oppose a word of mine -> that word
    forms: dict[str, list[tuple[str, str]]] = {}  # stem -> (prefix, word of mine)
    for word in sorted(mine, reverse=True):
        for partner in _OPPOSITE_STEMS.get(_stem(word), ()):
            opposites[partner] = word
        for prefix, stem in _polar_forms(word):
            forms.setdefault(stem, []).append((prefix, word))
    for other in sorted(theirs):
        opposed = opposites.get(_stem(other))
        if opposed is not None:
            return opposed, other
        for prefix, stem in _polar_forms(other):
            for own_prefix, own in forms.get(stem, ()):
                if own_prefix != prefix:
                    return own, other
    return None


def _polar_forms(word: str) -> list[tuple[str, str]]:
    """The (prefix, stem) readings of `word`: itself unprefixed, and each polar prefix it
    starts with, before a stem of at least four letters ("illegal": ("il", "legal"))."""
    forms = [("", word)]
    for prefix in words.POLAR_PREFIXES:
        stem = word[len(prefix):].lstrip("-")
        if word.startswith(prefix) and len(stem) >= 4:
            forms.append((prefix, stem))
    for suffix, opposite in words.SUFFIX_OPPOSITES:  # "careful"/"careless": one stem, two ends
        for end in (suffix, opposite):
            if word.endswith(end) and len(word) > len(end) + 2:
                forms.append(("-" + end, word[:-len(end)] + "-"))  # meets only suffix forms
    return forms


def _stem(word: str) -> str:
    """A crude stem, enough to match inflections of one word ("declining", "declined",
    "declines" and "decline"), never to merge two words."""
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


_AUDIENCES = tuple((name, frozenset(_stem(word) for word in members)) for name, members in (
    ("novice", words.NOVICE), ("expert", words.EXPERT), ("brief", words.BRIEF),
    ("detailed", words.DETAILED)))
_AUDIENCE_WORDS = words.NOVICE | words.EXPERT | words.BRIEF | words.DETAILED
_AUDIENCE_STEMS = frozenset(_stem(word) for word in _AUDIENCE_WORDS)
_OPPOSITE_STEMS: dict[str, set[str]] = {}
for _pair in words.ANTONYMS:
    _first, _second = sorted(_stem(word) for word in _pair)
    _OPPOSITE_STEMS.setdefault(_first, set()).add(_second)
    _OPPOSITE_STEMS.setdefault(_second, set()).add(_first)
_PHRASES = re.compile(r"\b(?:" + "|".join(map(re.escape, words.PHRASES)) + r")\b", re.I)


def _pairs(lows: list[str]) -> tuple[tuple[frozenset[str], frozenset[str]], ...]:
    """For each directional word, the named things before and after it (the source side
    first): up to three content words each way, within the clause."""
    pairs = []
    for index, low in enumerate(lows):
        if low not in words.DIRECTIONAL and low not in words.REVERSED_DIRECTIONAL:
            continue
        before = _content(reversed(lows[:index]))
        after = _content(lows[index + 1:])
        if low in words.REVERSED_DIRECTIONAL:
            before, after = after, before
        if before and after:
            pairs.append((before, after))
        if low == "from":  # "from X to Y": X and Y are the ends
            for later in range(index + 1, len(lows)):
                if lows[later] in words.DIRECTIONAL:
                    target = _content(lows[later + 1:])
                    if after and target:
                        pairs.append((after, target))
                    break
    return tuple(pairs)


def _content(sequence: Iterable[str]) -> frozenset[str]:
    found: list[str] = []
    for low in sequence:
        if low in _SENTENCE_END or low == "," or low in words.DIRECTIONAL \
                or low in words.REVERSED_DIRECTIONAL:
            break
        if low in words.STOPWORDS:
            continue
        found.append(low)
        if len(found) == CONTEXT_WORDS:
            break
    return frozenset(found)


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


def _entities(tokens: list[_Token]) -> frozenset[str]:
    """Names: upper-case or mixed-case words anywhere, capitalised words not opening a sentence."""
    found: set[str] = set()
    for index, token in enumerate(tokens):
        if token.kind != "word" or not token.raw[:1].isalpha() or len(token.low) < 2:
            continue
        raw = token.raw
        inner_capital = any(char.isupper() for char in raw[1:])
        opens = index == 0 or tokens[index - 1].low in _SENTENCE_END
        if inner_capital or (raw[0].isupper() and not opens):
            if token.low in words.STOPWORDS or token.low in words.NOVICE | words.EXPERT:
                continue
            found.update(part for part in re.findall(r"[^\W\d_]+", token.low) if len(part) > 1)
    return frozenset(found)


def _script(text: str) -> str:
    """The writing system most of the letters of `text` are in ("" when it has none)."""
    if text.isascii():
        return "latin" if any(char.isalpha() for char in text) else ""
    counts: dict[str, int] = {}
    for char in text:
        if char.isalpha():
            script = _char_script(char)
            counts[script] = counts.get(script, 0) + 1
    if "japanese" in counts:  # kana: Japanese, whatever share its kanji have
        return "japanese"
    return max(counts, key=lambda script: counts[script]) if counts else ""


@lru_cache(maxsize=4096)
def _char_script(char: str) -> str:
    if ord(char) < 0x250:
        return "latin"
    name = unicodedata.name(char, "")
    for prefix, script in _SCRIPTS:
        if name.startswith(prefix):
            return script
    return "other"


def _language(lows: list[str]) -> str:
    scores = {code: sum(low in vocabulary for low in lows)
              for code, vocabulary in words.LANGUAGE_WORDS.items()}
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    (best, top), (_, second) = ranked[0], ranked[1]
    return best if top >= 2 and top > second else ""


def _audience(lows: list[str]) -> frozenset[str]:
    found: set[str] = set()
    for low in lows:
        stem = _stem(low)
        for name, members in _AUDIENCES:
            if stem in members:
                found.add(name)
                break
    joined = " ".join(lows)
    if re.search(r"\blike i (?:am|m)?\s*(?:a |an )?(?:\d+|five|young|child|kid)\b", joined):
        found.add("novice")
    explaining = any(low in words.AUDIENCE_VERBS for low in lows)
    for match in re.finditer(r"\b(?:like i(?: am)?|as an?|to an?|to my|for an?|for my)\s+"
                             r"((?:[\w-]+\s+){0,2}[\w-]+)", joined):
        if explaining or match.group().startswith("like"):
            phrase = _audience_phrase(match.group(1))
            if phrase:
                found.add("for " + phrase)
    return frozenset(found)


def _audience_phrase(text: str) -> str:
    """Who an audience phrase names ("a network engineer": "network engineer"); "" when the
    word lists already classed it ("a complete beginner") or it names no one."""
    kept = []
    for word in text.split():
        if word in words.STOPWORDS or word in words.DIRECTIONAL or word in _SENTENCE_END:
            break
        if word in _AUDIENCE_WORDS or _stem(word) in _AUDIENCE_STEMS:
            return ""
        kept.append(_stem(word))
    return " ".join(kept)
