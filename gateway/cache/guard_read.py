"""Reading a question for the guard (gateway/cache/guard.py): its tokens, and from them its
numbers, dates, units, directional pairs, names, script, language and audience.

Pure functions of text. Each reader keeps what decides an answer and drops what does not: a
number is its value ("five", "5", "5th"), a unit its canonical name ("km", "kilometres"), a
word its crude stem ("declining", "decline"), so that two wordings of one question read alike.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from gateway.cache import guard_words as words

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
_COUNTED = re.compile(r"(\d+(?:[.,]\d+)*)(?:st|nd|rd|th|s)?")
_CLITIC = re.compile(r"'(?:s|re|ve|ll|m|d)$|'$")
_POSSESSIVE = re.compile(r"['’]s$")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LETTERS = re.compile(r"[^\W\d_]+")
_WHO = words.NOVICE | words.EXPERT
_LIKE_A_CHILD = re.compile(r"\blike i (?:am|m)?\s*(?:a |an )?(?:\d+|five|young|child|kid)\b")
_AUDIENCE_PHRASE = re.compile(r"\b(?:like i(?: am)?|as an?|to an?|to my|for an?|for my)\s+"
                              r"((?:[\w-]+\s+){0,2}[\w-]+)")
_SEASON_OPENERS = words.RELATIVE | {"the", "in"}
_SCRIPTS = (("CYRILLIC", "cyrillic"), ("GREEK", "greek"),
            ("ARABIC", "arabic"), ("HEBREW", "hebrew"), ("HIRAGANA", "japanese"),
            ("KATAKANA", "japanese"), ("CJK", "han"), ("HANGUL", "hangul"),
            ("DEVANAGARI", "devanagari"), ("THAI", "thai"), ("LATIN", "latin"))
WORDS_KEPT = 65_536  # words whose readings are kept (a few MB)
SENTENCE_END = frozenset(".?!:;¿¡(")
CONTEXT_WORDS = 3  # content words read on each side of a directional word


@dataclass(frozen=True, slots=True)
class Token:
    raw: str  # as written
    low: str  # casefolded, possessive and apostrophes handled
    kind: str  # arrow, word, sym, punct


@lru_cache(maxsize=WORDS_KEPT)  # pure: a word read once per process, mostly
def content_word(low: str) -> str:
    """A word as the other checks read it: a number its value, a unit its name, a negation
    "not", else its stem; so "tenth" is "10th" and "km" is "kilometres" here too."""
    if low in words.NUMBER_WORDS:
        return str(words.NUMBER_WORDS[low])
    number = _COUNTED.fullmatch(low)
    if number:
        return canonical_number(number.group(1))
    if low in words.NEGATIONS:
        return "not"
    unit = unit_of(low, low)
    return unit[1] if unit is not None else word_stem(low)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "punct"
        raw = match.group()
        low = raw.casefold().replace("’", "'")
        if kind == "word":
            low = low.rstrip(".:")  # a sentence's full stop, not part of the word
            if _ABBREVIATION.match(raw):
                low = low.replace(".", "")
            if low in words.CONTRACTIONS:
                tokens.extend(Token(raw, part, kind) for part in words.CONTRACTIONS[low])
                continue
            if low.endswith("n't"):
                tokens.extend((Token(raw, low[:-3], kind), Token(raw, "not", kind)))
                continue
            low = _CLITIC.sub("", low)
        tokens.append(Token(raw, low, kind))
    return tokens


def is_hyphenated(low: str) -> bool:
    return _HYPHENATED.match(low) is not None


@lru_cache(maxsize=WORDS_KEPT)  # pure: a word read once per process, mostly
def is_identifier(raw: str) -> bool:
    word = _POSSESSIVE.sub("", raw.rstrip(".:"))
    if not word or _HYPHENATED.match(word) or _ABBREVIATION.match(word) or _ORDINAL.match(word):
        return False
    if word.replace(".", "").replace(",", "").isdigit():
        return False  # a number: compared as one
    if word.casefold() in words.UNITS or word.casefold() in AUDIENCE_WORDS:
        return False
    has_digit = any(char.isdigit() for char in word)
    has_alpha = any(char.isalpha() for char in word)
    return bool(_IDENTIFIER.search(word)) or (has_digit and has_alpha)


def numbers_of(text: str, lows: list[str]) -> frozenset[str]:
    found: set[str] = set()
    for match in _NUMBER.finditer(text):
        found.add(canonical_number(match.group(1)))
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


def canonical_number(number: str) -> str:
    """Thousands separators dropped ("1,000"), a decimal comma read as a point ("1,5")."""
    if _THOUSANDS.fullmatch(number):
        number = number.replace(",", "")
    number = number.replace(",", ".")
    whole, _, fraction = number.partition(".")
    whole = whole.lstrip("0") or "0"
    return f"{whole}.{fraction}" if fraction else whole


def dates_of(tokens: list[Token]) -> frozenset[str]:
    found: set[str] = set()
    lows = [token.low for token in tokens]
    for index, token in enumerate(tokens):
        low = token.low
        if low in words.MONTHS and (low not in words.AMBIGUOUS_MONTHS or any(
                0 <= other < len(lows) and lows[other][:1].isdigit()
                for other in (index - 1, index + 1)) or (token.raw[:1].isupper() and index > 0)):
            found.add(words.MONTHS[low])
        elif low in words.WEEKDAYS:
            found.add(words.WEEKDAYS[low])
        elif low in words.TIME_WORDS:
            found.add(low)
        elif low in words.SEASON_ALIASES and index and lows[index - 1] in (
                _SEASON_OPENERS):
            found.add(words.SEASON_ALIASES[low])
        if low in words.RELATIVE and index + 1 < len(lows):
            following = lows[index + 1]
            if following in words.PERIODS or following in words.WEEKDAYS:
                found.add(f"{low} {following}")
    return frozenset(found)


def units_of(tokens: list[Token]) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """The units named, and the conversions among them: two units a few words apart with a
    linking word between ("ounces in a pound"), in their order. A hyphenated word is read
    part by part ("6-month-old" as "6 month old")."""
    named: list[tuple[str, int]] = []
    parts = [part for token in tokens for part in (
        [(piece, piece) for piece in token.low.split("-")] if _HYPHENATED.match(token.low)
        else [(token.raw, token.low)])]  # (as written, casefolded): "MB" is not "Mb"
    lows = [low for _, low in parts]
    for index, low in enumerate(lows):
        unit = unit_of(parts[index][0], low)
        if unit is None:
            continue
        form, name = unit
        if form in words.NEEDS_NUMBER:
            previous = lows[index - 1] if index else ""
            if not (previous[:1].isdigit() or previous in words.NUMBER_WORDS
                    or previous in words.COUNT_WORDS):
                continue
        named.append((name, index))
    conversions = set()
    for (first, start), (second, end) in zip(named, named[1:], strict=False):
        if first != second and end - start <= 6 and words.LINKS & set(lows[start + 1:end]):
            conversions.add((first, second))
    return frozenset(name for name, _ in named), frozenset(conversions)


@lru_cache(maxsize=WORDS_KEPT)  # pure: a word read once per process, mostly
def unit_of(raw: str, low: str) -> tuple[str, str] | None:
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


@lru_cache(maxsize=WORDS_KEPT)  # pure: a word read once per process, mostly
def word_stem(word: str) -> str:
    """A crude stem, enough to match inflections of one word ("declining", "declined",
    "declines" and "decline"), never to merge two words."""
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


_AUDIENCES = tuple((name, frozenset(word_stem(word) for word in members)) for name, members in (
    ("novice", words.NOVICE), ("expert", words.EXPERT), ("brief", words.BRIEF),
    ("detailed", words.DETAILED)))
AUDIENCE_WORDS = words.NOVICE | words.EXPERT | words.BRIEF | words.DETAILED | words.PLAIN
_AUDIENCE_STEMS = frozenset(word_stem(word) for word in AUDIENCE_WORDS)
_PHRASES = re.compile(r"\b(?:" + "|".join(map(re.escape, words.PHRASES)) + r")\b", re.I)


def directional_pairs(lows: list[str]) -> tuple[tuple[frozenset[str], frozenset[str]], ...]:
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
        if low in SENTENCE_END or low == "," or low in words.DIRECTIONAL \
                or low in words.REVERSED_DIRECTIONAL:
            break
        if low in words.STOPWORDS:
            continue
        found.append(low)
        if len(found) == CONTEXT_WORDS:
            break
    return frozenset(found)


def entities_of(tokens: list[Token]) -> frozenset[str]:
    """Names: upper-case or mixed-case words anywhere, capitalised words not opening a sentence."""
    found: set[str] = set()
    for index, token in enumerate(tokens):
        if token.kind != "word" or not token.raw[:1].isalpha() or len(token.low) < 2:
            continue
        raw = token.raw
        inner_capital = raw[1:] != raw[1:].lower()
        opens = index == 0 or tokens[index - 1].low in SENTENCE_END
        if inner_capital or (raw[0].isupper() and not opens):
            if token.low in words.STOPWORDS or token.low in _WHO:
                continue
            found.update(part for part in _LETTERS.findall(token.low) if len(part) > 1)
    return frozenset(found)


def script_of(text: str) -> str:
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


_LANGUAGES_OF: dict[str, tuple[str, ...]] = {}  # a function word -> the languages it is of
for _code, _vocabulary in words.LANGUAGE_WORDS.items():
    for _word in _vocabulary:
        _LANGUAGES_OF[_word] = (*_LANGUAGES_OF.get(_word, ()), _code)


def language_of(lows: list[str]) -> str:
    scores = dict.fromkeys(words.LANGUAGE_WORDS, 0)
    for low in lows:
        for code in _LANGUAGES_OF.get(low, ()):
            scores[code] += 1
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    (best, top), (_, second) = ranked[0], ranked[1]
    return best if top >= 2 and top > second else ""


def audience_of(lows: list[str]) -> frozenset[str]:
    found: set[str] = set()
    for low in lows:
        stem = word_stem(low)
        for name, members in _AUDIENCES:
            if stem in members:
                found.add(name)
                break
    explaining = not words.AUDIENCE_VERBS.isdisjoint(lows)
    likening = "like" in lows
    if not (explaining or likening):  # no audience phrase to read
        return frozenset(found)
    joined = " ".join(lows)
    if likening and _LIKE_A_CHILD.search(joined):
        found.add("novice")
    if explaining and not words.PLAIN.isdisjoint(lows):
        found.add("novice")
    for match in _AUDIENCE_PHRASE.finditer(joined):
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
        if word in words.STOPWORDS or word in words.DIRECTIONAL or word in SENTENCE_END:
            break
        if word in AUDIENCE_WORDS or word_stem(word) in _AUDIENCE_STEMS:
            return ""
        kept.append(word_stem(word))
    return " ".join(kept)

def prepare(text: str) -> tuple[str, set[str], set[str]]:
    """`text` normalised (NFKC), with its code spans and quoted strings taken out (a comma in
    their place) and returned apart: code verbatim, quoted strings casefolded; degree signs
    and the phrases of `PHRASES` spelt as words."""
    text = unicodedata.normalize("NFKC", text)
    code = {next(g for g in match.groups() if g is not None).strip()
            for match in _CODE_SPAN.finditer(text)}
    text = _CODE_SPAN.sub(" , ", text)
    quoted = {" ".join(next(g for g in match.groups() if g is not None).casefold().split())
              for match in _QUOTED.finditer(text)}
    text = _QUOTED.sub(" , ", text)
    text = _DEGREES.sub(lambda match: " celsius" if match.group(1) == "C" else " fahrenheit",
                        text)
    return _PHRASES.sub(lambda match: words.PHRASES[match.group().casefold()], text), code, quoted
