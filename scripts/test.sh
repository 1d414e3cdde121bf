#!/usr/bin/env bash
# Installs what the tests need (into .venv, plus the real RocketMQ clients) and runs the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
bash "$root/scripts/bootstrap_clients.sh"
cd "$root"
# The suite checks that the C extension was built and is in use (tests/test_speedups.py).
export SLUICE_REQUIRE_EXTENSIONS="${SLUICE_REQUIRE_EXTENSIONS:-1}"
exec "$root/.venv/bin/python" -m pytest "$@"
