"""A busy backend's hot answers read from their numbers: `HotTemplate`, the last hot answer parsed
whole, kept as a template for the next ones. The poller (routing/poller.py) makes, keeps and ends
templates; its module docstring states the tiers that hot answers belong to.

A busy server's hot answer changes at every scrape, but only in its numbers. The last hot answer
parsed whole is kept as a template (routing/metrics/template.py: its text without the numbers,
and which sample each number is); a hot answer with the same text is read from its numbers alone,
into the load figures of the template's snapshot (routing/metrics `rebuilt`: running, waiting and
the KV figures; the others depend on names, labels and the slow groups only). The result is the
snapshot a whole parse gives (tests/test_routing_metrics_template.py,
tests/test_routing_poller_tiers.py). A template serves with the slow groups it was read with; a
full answer that brings other slow groups takes it over when its load series have the template's
names and labels, else ends it, and the next hot answer is parsed whole and is the next template.
Any hot answer unlike the template (another label, line or comment) is parsed whole and becomes
the template.

Contract
- A template is frozen; its methods take values and return values: no I/O, no clock (`taken_at`
  is passed in).
- `HotTemplate.of` keeps the numbers' places (`values`) only when reading the answer's numbers
  back gives its very snapshot; otherwise `values` is None and `snapshot_of` always answers None.
  `snapshot_of` answers None too for an answer that differs from the template in more than its
  numbers; the caller then parses that answer whole.
- A template is tied to the very `slow` object it was completed with: the poller ends it when the
  backend's slow groups are replaced, unless `rebased` carries it over to the new ones.
"""

from __future__ import annotations

import dataclasses

from routing.metrics import Reading, rebuilt
from routing.metrics.prom import Groups, Samples, parse_groups
from routing.metrics.template import ValueTemplate
from routing.state import BackendSnapshot

__all__ = ["HotTemplate"]


@dataclasses.dataclass(frozen=True, slots=True)
class HotTemplate:
    """A hot answer parsed whole, with `slow` (the very object: a new full answer whose slow
    groups changed replaces it, and so ends the template): the next hot answers that differ
    from it only in their numbers are read from those (routing/metrics/template.py) into its
    snapshot's load figures (routing/metrics `rebuilt`)."""

    slow: Groups
    family: str
    groups: Groups  # of its reading
    snapshot: BackendSnapshot
    values: ValueTemplate | None  # None: its numbers alone cannot give its snapshot back

    @classmethod
    def of(
        cls, body: bytes, reading: Reading, snapshot: BackendSnapshot, slow: Groups,
        hot_names: tuple[str, ...],
    ) -> HotTemplate:
        """The template of a hot answer: its `body`, its `reading` (completed with `slow`), the
        `snapshot` they gave, and the names of its load series."""
        samples = _load_samples(reading, hot_names)
        values = ValueTemplate.of(body, samples, hot_names)
        if values is not None:  # which read these samples back from `body`
            load = {name: samples[name] for name in hot_names}
            again = rebuilt(
                reading.family, snapshot, load, reading.groups, taken_at=snapshot.taken_at)
            if again != snapshot:
                values = None
        return cls(slow, reading.family, reading.groups, snapshot, values)

    def rebased(
        self, slow: Groups, full: Reading, snapshot: BackendSnapshot, hot_names: tuple[str, ...]
    ) -> HotTemplate | None:
        """This template for the hot answers completed with `slow`, the slow groups of the full
        answer `full` that gave `snapshot`. None when that answer's load series have other names
        or labels than this template's: its snapshot's other fields could then differ from what
        the hot answers give."""
        if self.values is None or not self.values.same_series(_load_samples(full, hot_names)):
            return None
        return HotTemplate(slow, full.family, full.groups, snapshot, self.values)

    def snapshot_of(self, body: bytes, taken_at: float) -> BackendSnapshot | None:
        """The snapshot of a hot answer that differs from this one only in its numbers."""
        if self.values is None:
            return None
        load = self.values.samples_of(body)
        if load is None:
            return None
        return rebuilt(self.family, self.snapshot, load, self.groups, taken_at=taken_at)


def _load_samples(reading: Reading, hot_names: tuple[str, ...]) -> Samples:
    return parse_groups(reading.groups, frozenset(hot_names))
