"""The retry budget: retries at once stay under a fifth of the requests in flight, with a floor
of 3, and a finished retry gives its share back."""

from __future__ import annotations

import pytest

from routing.retry_budget import RetryBudget, retry_allowed


@pytest.mark.parametrize(("in_flight", "retrying", "allowed"), [
    (1, 0, True), (1, 2, True), (1, 3, False),
    (10, 2, True), (10, 3, False),
    (20, 3, True), (20, 4, False),
    (100, 19, True), (100, 20, False),
    (0, 0, True),
], ids=["a lone request may retry", "the floor allows a third", "the floor stops a fourth",
        "10 in flight: the floor, 3", "10 in flight: not a fourth",
        "20 in flight: a fifth, 4", "20 in flight: not a fifth one",
        "100 in flight: 20", "100 in flight: not 21",
        "nothing in flight: the floor"])
def test_a_retry_is_allowed_below_a_fifth_of_the_requests_in_flight_or_3(
    in_flight: int, retrying: int, allowed: bool
) -> None:
    assert retry_allowed(in_flight, retrying) is allowed


def test_a_finished_retry_gives_its_share_back() -> None:
    budget = RetryBudget()
    for _ in range(10):
        budget.started()
    for _ in range(3):
        assert budget.allows()
        budget.take()
    assert not budget.allows()
    budget.retry_ended()
    assert budget.allows()


def test_fewer_requests_in_flight_shrink_the_budget_to_its_floor() -> None:
    budget = RetryBudget()
    for _ in range(25):
        budget.started()
    for _ in range(5):
        budget.take()
    assert not budget.allows()
    for _ in range(20):
        budget.ended()
    budget.retry_ended()
    budget.retry_ended()
    assert not budget.allows()  # 5 in flight: the floor, 3, and 3 still retrying
    budget.retry_ended()
    assert budget.allows()


@pytest.mark.parametrize(("ratio", "floor"), [(-0.1, 3), (1.5, 3), (0.2, -1)],
                         ids=["negative ratio", "ratio above 1", "negative floor"])
def test_a_budget_out_of_range_is_refused(ratio: float, floor: int) -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio=ratio, min_concurrent=floor)
