#!/usr/bin/env bash
# Installs what the tests need (into .venv, plus the real RocketMQ clients) and runs the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
bash "$root/scripts/bootstrap_clients.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
