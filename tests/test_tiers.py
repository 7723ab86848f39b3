"""The tier table of tests/conftest.py: one tier for every test, measured entries first, a rule
by name for a module not yet measured, and a unit test that opens a socket or a process fails."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.conftest import DEFAULTS, MODULES, OVERRIDES, TIERS, tier_of


@pytest.mark.parametrize(
    ("module", "name", "original", "expected"),
    [
        pytest.param("test_gateway_admission", "test_tenant", "test_tenant", ("unit", True),
                     id="an override by test name beats its module's tier"),
        pytest.param("test_cache_store", "test_store[redis-an entry is gone after its ttl]",
                     "test_store", ("realtime", True),
                     id="an override by parameter id takes that case alone"),
        pytest.param("test_cache_store", "test_store[redis-put replaces the same id]",
                     "test_store", ("loopback", True),
                     id="the other cases keep their module's tier"),
        pytest.param("test_routing_cost", "test_x", "test_x", ("unit", True),
                     id="a measured module gives its tier"),
        pytest.param("test_routing_brand_new", "test_x", "test_x", ("unit", False),
                     id="a new routing module is guessed unit"),
        pytest.param("test_bench_brand_new", "test_x", "test_x", ("bench", False),
                     id="a new bench module is guessed bench"),
        pytest.param("test_anything_else", "test_x", "test_x", ("loopback", False),
                     id="any other new module is guessed loopback"),
    ],
)
def test_a_tests_tier(module: str, name: str, original: str,
                      expected: tuple[str, bool]) -> None:
    assert tier_of(module, name, original) == expected


def test_every_entry_names_a_known_tier_and_every_name_has_a_default() -> None:
    assert set(MODULES.values()) | set(OVERRIDES.values()) <= set(TIERS)
    assert {tier for _, tier in DEFAULTS} <= set(TIERS) and DEFAULTS[-1][0] == ""


def test_a_unit_test_that_opens_a_socket_fails() -> None:
    with socket.socket() as sock, pytest.raises(AssertionError, match="tiered unit"):
        sock.bind(("127.0.0.1", 0))


def test_a_unit_test_that_starts_a_process_fails() -> None:
    with pytest.raises(AssertionError, match="tiered unit"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
