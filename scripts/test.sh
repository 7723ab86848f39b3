#!/usr/bin/env bash
# Installs everything the test suite needs into .venv (system packages too, when run as root on
# Debian/Ubuntu), then runs the linters, the type checker and the test suite tier by tier (tiers:
# tests/conftest.py): the fast ones (unit, loopback) in parallel, then realtime and bench one
# test at a time, printing each run's wall and CPU time. Extra arguments go to every pytest run,
# e.g. `./scripts/test.sh -x` or `./scripts/test.sh tests/test_gateway_api.py`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is missing: install Debian's redis-server package (sudo apt-get install redis-server)" >&2
    exit 2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

.venv/bin/ruff check gateway routing loadtest tests
.venv/bin/mypy

# tiers "EXPRESSION" PYTEST-OPTIONS...: runs the tests of the tiers EXPRESSION selects (a pytest
# -m expression) and prints the wall and CPU time they took. None selected (pytest's exit code
# 5, e.g. a file of unit tests alone) is not a failure.
tiers() {
  local expression=$1 status=0
  shift
  local TIMEFORMAT="tiers $expression: %0R s wall, %0U s user + %0S s system CPU"
  time .venv/bin/pytest -q -m "$expression" "$@" || status=$?
  [ "$status" = 0 ] || [ "$status" = 5 ] || exit "$status"
}

# The fast tiers in one parallel run: the loopback tests' waits overlap the unit tests' work,
# and the workers import and collect the suite once.
tiers "unit or loopback" -n 2 "$@"
tiers realtime "$@"
tiers bench "$@"
tiers faults -n 2 --dist loadfile "$@"  # the fault rows; a module's rows share one worker
# Real engines (llama.cpp's llama-server, vLLM's CPU build), built once and cached by
# scripts/real-engines.sh (minutes cold, seconds warm), then the tier that runs against them.
scripts/real-engines.sh
KVGATE_ENGINES=${KVGATE_ENGINES_DIR:-$HOME/.cache/kvgate-engines} tiers engines "$@"
scripts/floor_check.sh  # the oldest dependency versions pyproject.toml allows, in .venv-floor
