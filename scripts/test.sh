#!/usr/bin/env bash
# Runs tollgate's whole test suite against real redis-server processes that the
# tests start themselves. Installs redis-server and redis-tools first when they
# are missing (Debian/Ubuntu, via apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "tollgate: redis-server/redis-cli not found; installing redis-server and redis-tools with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
    echo "tollgate: installed $(redis-server --version | cut -d' ' -f1-3)" >&2
fi

exec cargo test --workspace --all-features "$@"
