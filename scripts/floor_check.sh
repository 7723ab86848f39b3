#!/usr/bin/env bash
# Checks that the oldest versions pyproject.toml allows really work: installs the project into
# .venv-floor with every dependency pinned to its floor (the `>=` version of each requirement,
# runtime and extras alike) and runs a representative part of the suite there: the HTTP server
# and proxy (aiohttp, uvloop, orjson, pydantic, PyYAML), the response cache (redis), telemetry
# (OpenTelemetry, prometheus-client), `kvgate serve`, `kvgate top` (httpx, rich), the cache
# command and `kvgate simulate --plot` (matplotlib). The OTLP extra is only resolved against the
# floors (its exporter must match the SDK's release), not installed: the tests expect it absent.
# Linters and locust are not run here. A floor must name a release that exists: it is installed
# exactly.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-floor
# The test tools the subset needs; each is pinned to its floor like the runtime dependencies.
TEST_TOOLS=(pytest pytest-asyncio pytest-timeout hypothesis openai prometheus-client rich)
TESTS=(tests/test_gateway_api.py tests/test_gateway_proxy.py tests/test_cache_store.py
       tests/test_telemetry_*.py tests/test_gateway_serve.py tests/test_top.py
       tests/test_cache_admin.py tests/test_gateway_disconnect.py tests/test_routing_scrape_client.py
       tests/test_fleetsim_cli.py::test_plot_writes_a_png_or_names_the_missing_extra)

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" - > "$VENV/floors.txt" <<'EOF'
import re
import tomllib

with open("pyproject.toml", "rb") as file:
    project = tomllib.load(file)["project"]
requirements = list(project["dependencies"])
for extra in project.get("optional-dependencies", {}).values():
    requirements += extra
floors: dict[str, str] = {}
for requirement in requirements:
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)", requirement)
    if match is None:
        continue
    name, version = match[1].lower(), match[2]
    if floors.setdefault(name, version) != version:
        raise SystemExit(f"pyproject.toml: {name} has two floors, {floors[name]} and {version}")
for name, version in sorted(floors.items()):
    print(f"{name}=={version}")
EOF
"$VENV/bin/python" -m pip install -q -c "$VENV/floors.txt" -e '.[plot]' "${TEST_TOOLS[@]}"
"$VENV/bin/python" -m pip install -q --dry-run -c "$VENV/floors.txt" -e '.[otlp]' >/dev/null
echo "floor check: $(tr '\n' ' ' < "$VENV/floors.txt")"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
