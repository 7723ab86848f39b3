"""Pre-aggregated histograms count exactly like the SDK's explicit-bucket aggregation."""

from __future__ import annotations

import pytest

from gateway.telemetry.histograms import HistogramFamily

BOUNDS = (0.1, 0.5, 1.0)


@pytest.mark.parametrize(
    ("value", "bucket"),
    [
        pytest.param(0.05, 0, id="below the first bound lands in the first bucket"),
        pytest.param(0.1, 0, id="a value equal to a bound belongs to that bound's bucket"),
        pytest.param(0.3, 1, id="between two bounds lands in the upper one's bucket"),
        pytest.param(1.0, 2, id="the last bound is still inclusive"),
        pytest.param(7.0, 3, id="above every bound lands in the +Inf bucket"),
    ],
)
def test_a_value_lands_in_the_bucket_of_the_first_bound_not_below_it(
    value: float, bucket: int
) -> None:
    family = HistogramFamily("t", ("k",), BOUNDS, unit="s", description="")
    series = family.series(("a",))
    series.record(value)
    expected = [0, 0, 0, 0]
    expected[bucket] = 1
    assert series.counts == expected and series.count == 1 and series.sum == value


def test_one_label_set_is_one_series_and_sums_accumulate() -> None:
    family = HistogramFamily("t", ("k",), BOUNDS, unit="s", description="")
    family.series(("a",)).record(0.2)
    family.series(("a",)).record(0.4)
    family.series(("b",)).record(2.0)
    by_label = {s.attributes["k"]: s for s in family.points()}
    assert by_label["a"].count == 2 and by_label["a"].sum == pytest.approx(0.6)
    assert by_label["b"].counts == [0, 0, 0, 1]


def test_an_empty_label_value_is_left_out_and_unrecorded_series_are_not_reported() -> None:
    family = HistogramFamily("t", ("model", "error"), BOUNDS, unit="s", description="")
    family.series(("m", "")).record(0.2)
    family.series(("m", "timeout"))  # looked up, never recorded
    assert [s.attributes for s in family.points()] == [{"model": "m"}]
