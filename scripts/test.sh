#!/usr/bin/env bash
# Installs everything the test suite needs into .venv (system packages too, when run as root on
# Debian/Ubuntu), then runs the linters, the type checker and the whole test suite.
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
.venv/bin/pytest -q "$@"
scripts/floor_check.sh  # the oldest dependency versions pyproject.toml allows, in .venv-floor
