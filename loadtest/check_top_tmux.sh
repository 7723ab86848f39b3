#!/usr/bin/env bash
# `kvgate top` in a real terminal (tmux, 120x40) against `kvgate demo` under a little load: starts
# the demo on a free loopback port, sends streamed requests for a while, lets top refresh for
# SECONDS (default 8) and prints the captured pane. Everything it starts is stopped on exit.
#
#   loadtest/check_top_tmux.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_TO_WATCH=${1:-8}
PY=.venv/bin/python
KVGATE=.venv/bin/kvgate
if ! command -v tmux >/dev/null 2>&1; then
  echo "tmux is missing: install Debian's tmux package (apt-get install tmux)" >&2
  exit 2
fi

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
SESSION="kvgate-top-check-$$"
DEMO_LOG=$(mktemp)
DEMO_PID=""
LOAD_PID=""

cleanup() {
  tmux kill-session -t "$SESSION" 2>/dev/null || true
  [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null || true
  if [ -n "$DEMO_PID" ]; then
    kill -TERM "$DEMO_PID" 2>/dev/null || true
    wait "$DEMO_PID" 2>/dev/null || true
  fi
  rm -f "$DEMO_LOG"
}
trap cleanup EXIT

"$KVGATE" demo --port "$PORT" --backends 2 --time-scale 4 >"$DEMO_LOG" 2>&1 &
DEMO_PID=$!

# Ready when /ready answers 200 (the backends are discovered); give up after 30 s.
"$PY" - "$URL" <<'EOF'
import sys, time, httpx
deadline = time.monotonic() + 30
while True:
    try:
        if httpx.get(sys.argv[1] + "/ready", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit("kvgate demo did not become ready")
    time.sleep(0.1)
EOF

# A little load: 6 concurrent streams, new ones as old ones end, until killed or 60 s passed.
"$PY" - "$URL" <<'EOF' &
import asyncio, sys, time, aiohttp
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

async def main(url: str) -> None:
    end = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < end:
                i += 1
                body = {"model": PRESETS[DEFAULT_PRESET].model_name, "max_tokens": 48,
                        "stream": True, "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"worker {w} question {i}"}]}
                async with http.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
        await asyncio.gather(*(worker(w) for w in range(6)))

asyncio.run(main(sys.argv[1]))
EOF
LOAD_PID=$!

tmux new-session -d -s "$SESSION" -x 120 -y 40 "$KVGATE top --url $URL --interval 1"
sleep "$SECONDS_TO_WATCH"
echo "--- kvgate top --url $URL, after ${SECONDS_TO_WATCH} s under load (tmux pane 120x40) ---"
tmux capture-pane -p -t "$SESSION"
