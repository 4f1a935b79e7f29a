#!/usr/bin/env bash
# tollgate's benchmark suite (issue #6) — the one command:
#
#   ./scripts/bench.sh                 # everything, 5 rounds (7–15 minutes on 2 cores)
#   ./scripts/bench.sh --quick         # a smoke test: a tenth of the work, 1 s wrk runs
#   ./scripts/bench.sh --skip http,peers --rounds 3
#
# Extra arguments go to `tollgate-bench all` (see `tollgate-bench all --help`).
#
# What it does:
#  1. installs what is missing: redis-server/redis-cli, node/npm, python3-venv
#     and wrk with apt-get (it says so first); the peers — rate-limiter-flexible
#     and ioredis with npm, limits and redis-py with pip into a venv — into a
#     cache directory (TOLLGATE_BENCH_CACHE, default ~/.cache/tollgate-bench),
#     at pinned versions;
#  2. builds crates/tollgate-bench in release mode;
#  3. starts a private redis-server on a free loopback port (persistence off),
#     and stops it at the end;
#  4. runs `tollgate-bench all` against it and prints the results as Markdown
#     tables, preceded by the environment (versions, machine, date); the same
#     report is written to $TOLLGATE_BENCH_OUT (default
#     <target dir>/tollgate-bench-report.md).
#
# Every figure is a ratio measured side by side in this one run (contenders
# interleaved in rounds, medians of rounds): absolute numbers depend on the
# machine and on whatever else runs on it. Copy the report into BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

RLF_VERSION=11.4.0
IOREDIS_VERSION=5.11.1
LIMITS_VERSION=5.8.0
REDIS_PY_VERSION=7.4.1

say() { echo "bench.sh: $*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
APT_UPDATED=""
apt_install() {
    say "installing $* with apt-get"
    if [ -z "$APT_UPDATED" ]; then
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# 1. Tools.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    say "redis-server/redis-cli not found"
    apt_install redis-server redis-tools
fi
if ! command -v wrk >/dev/null 2>&1; then
    say "wrk not found (the HTTP benchmark drives it)"
    apt_install wrk
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "node/npm not found (the rate-limiter-flexible peer runs on node)"
    apt_install nodejs npm
fi
if ! command -v python3 >/dev/null 2>&1; then
    say "python3 not found (the limits peer runs on it)"
    apt_install python3 python3-venv
fi

CACHE="${TOLLGATE_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-bench}"
mkdir -p "$CACHE"

# The node peer: rate-limiter-flexible + ioredis, pinned.
NODE_DIR="$CACHE/node"
installed_npm_version() {
    node -p "require('$NODE_DIR/node_modules/$1/package.json').version" 2>/dev/null || true
}
if [ "$(installed_npm_version rate-limiter-flexible)" != "$RLF_VERSION" ] ||
    [ "$(installed_npm_version ioredis)" != "$IOREDIS_VERSION" ]; then
    say "installing rate-limiter-flexible@$RLF_VERSION and ioredis@$IOREDIS_VERSION with npm into $NODE_DIR"
    mkdir -p "$NODE_DIR"
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --silent \
        "rate-limiter-flexible@$RLF_VERSION" "ioredis@$IOREDIS_VERSION" >/dev/null)
fi

# The Python peer: limits + redis-py in a venv, pinned.
VENV="$CACHE/venv"
if [ ! -x "$VENV/bin/python" ]; then
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        say "python3 cannot create a venv"
        apt_install python3-venv
        rm -rf "$VENV"
        python3 -m venv "$VENV"
    fi
fi
if ! "$VENV/bin/python" - "$LIMITS_VERSION" "$REDIS_PY_VERSION" <<'EOF' >/dev/null 2>&1; then
import sys
from importlib.metadata import version
sys.exit(0 if (version("limits"), version("redis")) == (sys.argv[1], sys.argv[2]) else 1)
EOF
    say "installing limits==$LIMITS_VERSION and redis==$REDIS_PY_VERSION with pip into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "limits==$LIMITS_VERSION" "redis==$REDIS_PY_VERSION"
fi

# 2. Build.
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
say "building tollgate-bench (release)"
cargo build --release -q -p tollgate-bench
BIN="$TARGET/release/tollgate-bench"

# 3. A private redis-server on a free loopback port.
REDIS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tollgate-bench-redis.XXXXXX")"
REDIS_PID=""
cleanup() {
    if [ -n "$REDIS_PID" ]; then
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
    fi
    rm -rf "$REDIS_DIR"
}
trap cleanup EXIT
for _ in 1 2 3 4 5; do
    PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$REDIS_DIR" --logfile "$REDIS_DIR/redis.log" --daemonize no &
    REDIS_PID=$!
    for _ in $(seq 1 100); do
        if redis-cli -p "$PORT" ping >/dev/null 2>&1; then break; fi
        if ! kill -0 "$REDIS_PID" 2>/dev/null; then break; fi
        sleep 0.05
    done
    if redis-cli -p "$PORT" ping >/dev/null 2>&1; then break; fi
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
    REDIS_PID=""
done
if [ -z "$REDIS_PID" ]; then
    say "could not start redis-server; its log:"
    cat "$REDIS_DIR/redis.log" >&2 || true
    exit 1
fi
say "redis-server (pid $REDIS_PID) on 127.0.0.1:$PORT"

# 4. Run.
OUT="${TOLLGATE_BENCH_OUT:-$TARGET/tollgate-bench-report.md}"
ENV_MD="$(mktemp)"
{
    echo "## Environment"
    echo
    echo "- command: \`./scripts/bench.sh${*:+ $*}\`"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, Linux $(uname -r)"
    echo "- load when starting: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
    echo "- $(rustc -V)"
    echo "- $(redis-server --version | cut -d' ' -f1-3)"
    echo "- node $(node --version), rate-limiter-flexible $(installed_npm_version rate-limiter-flexible), ioredis $(installed_npm_version ioredis)"
    echo "- $("$VENV/bin/python" --version), limits $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("limits"))'), redis-py $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("redis"))')"
    echo "- $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"
    echo
} >"$ENV_MD"
cat "$ENV_MD"
REPORT="$(mktemp)"
"$BIN" all \
    --redis-url "redis://127.0.0.1:$PORT/" \
    --node node --node-path "$NODE_DIR/node_modules" \
    --python "$VENV/bin/python" \
    --wrk wrk \
    --out "$REPORT" \
    "$@"
cat "$ENV_MD" "$REPORT" >"$OUT"
rm -f "$ENV_MD" "$REPORT"
say "report written to $OUT"
