"""The garbage collector while the gateway serves.

CPython collects its youngest generation every 700 net container allocations; a proxied request
allocates hundreds (the parsed body, headers, the exchange's records, the answer's events), so
with the default threshold the collector runs every request or two, each time traversing every
young object, while almost nothing a request allocates is ever part of a reference cycle: it is
freed by reference counting as the request ends. `serving_gc` raises the youngest generation's
threshold for as long as the gateway serves, so a collection comes once per many requests, and
first freezes what start-up allocated (configuration, routing tables, modules' objects) into the
permanent generation, so the older generations' collections no longer traverse it. Leaving the
block restores both.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GEN0_THRESHOLD = 50_000


@contextmanager
def serving_gc(gen0: int = GEN0_THRESHOLD) -> Iterator[None]:
    """The collector tuned for serving inside the block, as it was again after it."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(gen0, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
