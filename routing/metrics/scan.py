"""One format's series read out of a payload: `SeriesReader`, with a one-pass scan for small ones.

`prom.read_groups` jumps with `bytes.find` from one wanted name to the next, a few Python steps
per name: the fastest way through a whole payload (vLLM ~50 KB, TGI ~100 KB), where the wanted
lines are few and far apart. A filtered answer (`/metrics?name[]=...`, ~3 KB, routing/metrics/
query.py) holds little but the wanted lines, and there those steps are most of the cost. So a
payload of up to `SMALL_PAYLOAD` bytes is read with one regex pass instead: every group of a
wanted name (its first line, then the lines right after it that are the same name's) from a
single `findall`, the names as one alternation factored by common prefix, at C speed.

The scan gives exactly the groups `read_groups` (and `read_older` after it) gives, or gives up
and leaves the payload to them: when a name has two separate runs of lines (the general reader
then picks one by its search order), or when a line of a wanted counter's `_created` sibling
follows a group (the general reader may fold those in). A format whose names make that folding
ambiguous (a tail name with a sibling, a name that is another's sibling, an older name that is
also a current one) is never scanned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from routing.metrics.prom import Groups, read_groups, read_older, sibling_of

__all__ = ["SMALL_PAYLOAD", "SeriesReader"]

# Above this, `read_groups`' jumps cost less than a regex pass over every line (a whole payload is
# mostly lines not read); below it, a filtered answer, the one pass costs less.
SMALL_PAYLOAD = 8 * 1024


class SeriesReader:
    """Reads the groups of `names` (searched from the top), `tail` (from the bottom) and, for
    each (current, older) pair of `renamed` whose current name is missing, the older name's
    group: `read_older(payload, read_groups(payload, names, tail), renamed)`, sooner."""

    __slots__ = ("names", "tail", "renamed", "_pattern", "_name_of", "_older")

    def __init__(
        self,
        names: Sequence[str],
        tail: Sequence[str] = (),
        renamed: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.names = tuple(names)
        self.tail = tuple(tail)
        self.renamed = tuple(renamed)
        current = dict.fromkeys((*self.names, *self.tail))
        wanted = list(dict.fromkeys((*current, *(old for _, old in self.renamed))))
        siblings = {name: s for name in wanted if (s := sibling_of(name)) is not None}
        scannable = (
            not any(name in siblings for name in self.tail)
            and not any(sibling in wanted for sibling in siblings.values())
            and not any(old in current for _, old in self.renamed)
        )
        self._pattern: re.Pattern[bytes] | None = None
        if scannable:
            # A group: its first line (the `\n` before it consumed, not kept), then the lines
            # that start with the same name (`\2`); `[^\n]*` never crosses a line end. A
            # lookahead takes the group's line end (3) and the start of a `_created` sibling's
            # line right after it (4), which the general reader would fold in.
            sibling_names = sorted({sibling.encode() for sibling in siblings.values()})
            after = (rb"(?=(\n?)((?:" + _alternation(sibling_names) + rb")[{ \t])?)"
                     if sibling_names else rb"(?=(\n?)())")
            self._pattern = re.compile(
                rb"\n((" + _alternation(sorted(name.encode() for name in wanted))
                + rb")[{ \t][^\n]*+(?:\n\2[{ \t][^\n]*+)*+)" + after)
        self._name_of = {name.encode(): name for name in wanted}
        # older name -> the current names it stands in for: it is kept when any is missing
        older: dict[str, list[str]] = {}
        for new, old in self.renamed:
            older.setdefault(old, []).append(new)
        self._older = tuple((old, tuple(news)) for old, news in older.items())

    def read(self, payload: bytes) -> Groups:
        if len(payload) <= SMALL_PAYLOAD:
            groups = self.scan(payload)
            if groups is not None:
                return groups
        groups = read_groups(payload, self.names, self.tail)
        return read_older(payload, groups, self.renamed) if self.renamed else groups

    def scan(self, payload: bytes) -> Groups | None:
        """The groups `read` gives, in one regex pass over the payload (whatever its size), or
        None when the scan cannot tell them (see the module docstring)."""
        pattern = self._pattern
        if pattern is None:
            return None
        found = pattern.findall(b"\n" + payload)  # a first line is found like any other
        out: Groups = {}
        if found:
            groups, names, ends, siblings = zip(*found, strict=True)
            if any(siblings):
                return None  # `_created` lines after a group
            # Each group with its line end, as read_groups cuts it.
            out = dict(zip(map(self._name_of.__getitem__, names),
                           map(bytes.__add__, groups, ends), strict=True))
            if len(out) < len(found):
                return None  # two runs of one name
        for old, news in self._older:
            if old in out and all(new in out for new in news):
                del out[old]
        return out


_Trie = dict[int, "_Trie"]


def _alternation(words: Iterable[bytes]) -> bytes:
    """A regex matching exactly `words` (sorted, non-empty), factored by common prefix
    (`vllm:(?:num_requests_(?:running|waiting)|...)`): the engine then tries the few branches
    that can match a line rather than every name."""
    tree: _Trie = {}  # -1 marks a word's end
    for word in words:
        node = tree
        for byte in word:
            node = node.setdefault(byte, {})
        node[-1] = {}
    return _emit(tree)


def _emit(node: _Trie) -> bytes:
    branches = []
    for byte in sorted(key for key in node if key >= 0):
        literal, child = bytes([byte]), node[byte]
        while len(child) == 1 and -1 not in child:  # a chain of single bytes: one literal
            ((next_byte, child),) = child.items()
            literal += bytes([next_byte])
        branches.append(re.escape(literal) + _emit(child))
    if not branches:
        return b""
    body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
    return b"(?:" + body + b")?" if -1 in node else body
