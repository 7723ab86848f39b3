"""While the gateway serves, the youngest generation is collected far less often and start-up's
objects are frozen out of the collector's way; afterwards the collector is as it was."""

from __future__ import annotations

import gc

from gateway.gc_policy import GEN0_THRESHOLD, serving_gc


def test_serving_raises_the_young_threshold_and_freezes_start_up() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    start_up = [[i] for i in range(1000)]  # containers alive at start-up
    with serving_gc():
        assert gc.get_threshold() == (max(GEN0_THRESHOLD, before[0]), *before[1:])
        assert gc.get_freeze_count() >= frozen + len(start_up)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    del start_up


def test_a_threshold_set_higher_already_is_kept() -> None:
    before = gc.get_threshold()
    gc.set_threshold(10 * GEN0_THRESHOLD, *before[1:])
    try:
        with serving_gc():
            assert gc.get_threshold()[0] == 10 * GEN0_THRESHOLD
    finally:
        gc.set_threshold(*before)
