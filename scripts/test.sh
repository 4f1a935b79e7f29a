#!/usr/bin/env bash
# Runs tollgate's whole test suite against real redis-server processes that the
# tests start themselves, and the dashboard's tests in headless Chromium.
# Installs redis-server and redis-tools, and chromium and chromium-driver,
# first when they are missing (Debian/Ubuntu, via apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
UPDATED=""
apt_install() {
    if [ -z "$UPDATED" ]; then
        $SUDO apt-get update -qq
        UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "tollgate: redis-server/redis-cli not found; installing redis-server and redis-tools with apt-get" >&2
    apt_install redis-server redis-tools
    echo "tollgate: installed $(redis-server --version | cut -d' ' -f1-3)" >&2
fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "tollgate: chromium/chromedriver not found; installing chromium and chromium-driver with apt-get" >&2
    apt_install chromium chromium-driver
    echo "tollgate: installed $(chromium --version 2>/dev/null | head -n1)" >&2
fi

# The dashboard's browser tests run here, never skip.
export TOLLGATE_REQUIRE_BROWSER=1
exec cargo test --workspace --all-features "$@"
