#!/usr/bin/env bash
# Installs sluice (into .venv) and runs the main job.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/sluice" demo "$@"
